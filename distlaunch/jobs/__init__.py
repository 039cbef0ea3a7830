"""The job registry: records of every job on disk, so a job can be listed and looked at after its terminal is gone."""
