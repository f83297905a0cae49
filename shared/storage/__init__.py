"""The database engine: the SQLite/PostgreSQL connection seam (``db``), every dialect difference
(``dialect``), every SQL statement by name (``queries``), the tables (``models``), creating and upgrading them
(``schema``) and the states of their status columns (``statuses``), storage trouble classified once
(``errors``), the ``kv`` table's one owner (``kv``), WAL checkpoints and copying a database (``copy_db``),
backups of the live database and restoring them (``backup``, ``restore``, ``backup_record``). The bottom layer: it imports nothing of ``shared`` but the plain values beside this folder (``clock``, ``ids``,
``private_files``, …); everything that keeps data stands on it. Rules enforced by
``tests/unit/test_layering.py``."""
