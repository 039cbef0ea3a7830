"""A checkpoint folder as files, without torch: its step folders and ``latest`` pointer (``folder``), its
``meta.json`` (``manifest``), its checksums (``integrity``), what ``distlaunch checkpoint inspect|verify`` reports
(``report``). Which checkpoint a job resumes from is ``distlaunch.training.resume``; the engine's ``checkpoint``
package reads and writes the shards themselves."""
