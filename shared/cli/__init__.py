"""The ``agentpost`` command, an application of the core rather than part of it: the core commands
(``main``), talking to agents from a terminal (``talk``, ``chat``) and ``doctor``. It may import everything in
``shared``; nothing else in ``shared`` imports it. It finds process kinds, channels, doctor checks and extra
command groups through entry points (``agentpost.processes``, ``agentpost.channels``, ``agentpost.doctor``,
``agentpost.commands``), never by importing ``workers``, ``adapters`` or ``scheduler``. Rules enforced by
``tests/unit/test_layering.py``."""
