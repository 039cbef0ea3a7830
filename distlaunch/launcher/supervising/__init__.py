"""What watches a running attempt: each a ``Watch`` (``watch.py``) in the attempt's loop, built together by
``watches.py``, told of every agent event and asked every turn whether the job must stop; and the requests
commands leave for a running job."""
