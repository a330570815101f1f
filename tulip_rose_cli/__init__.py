"""``tulip-rose``: the command-line client of Ivy's public HTTP API.

``tulip-rose embed INPUT --out OUTPUT`` embeds a file of documents through a
running Ivy gateway, resumably. This package talks to Ivy over HTTP only: it
imports nothing from ROSE or Tulip, so it runs on any machine that can reach
the gateway.

``tulip-rose serve`` is the exception: it starts the stack itself (Tulip
replicas and Ivy, as child processes), so it needs the whole package and
the Ivy binary (``serve.py``)."""
