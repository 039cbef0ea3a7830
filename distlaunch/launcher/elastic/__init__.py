"""Jobs that outlive a host: spares and shrinking between attempts (``healing``), and per-node jobs, one launch
per node, that meet at a rendezvous store (``pernode``, ``rendezvous``)."""
