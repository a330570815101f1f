"""``tulip-rose``: the command-line client of Ivy's public HTTP API, and the
command that starts the whole stack on one machine.

``tulip-rose embed INPUT --out OUTPUT`` embeds a file of documents through a
running Ivy gateway, resumably. Its modules (``run``, ``client``,
``readers``, ``writers``, ``work``, ``progress``) talk to Ivy over HTTP only
and import nothing from ROSE; of Tulip, the command line imports only
``tulip.flags`` (pure Python: how booleans are read), so ``embed`` runs on
any machine that can reach the gateway.

What imports more, and only where it is used:
- ``tulip-rose serve`` (``serve.py``) starts Tulip replicas and Ivy as child
  processes: Tulip's launcher for the default model, ROSE's Hub resolution
  for a Hub id, and the Ivy binary.
- ``launch.py`` and ``processes.py`` are the one launcher of Tulip and Ivy
  processes (``serve``, the tests and the benchmarks use it); a ``Tulip``
  handle imports Tulip's gRPC client to know when the replica serves.
- ``ray.py``'s ``RoseEmbedder`` runs the ROSE engine inside a Ray actor
  (``IvyEmbedder`` talks to Ivy over HTTP only)."""
