"""One module per ``python -m bench`` command (``cpu`` runs the CPU suite):
each has ``TITLE``, ``options(scale)`` and ``run(stack, **options)``."""
