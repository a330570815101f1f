"""``tulip-rose``: the command-line client of Ivy's public HTTP API.

``tulip-rose embed INPUT --out OUTPUT`` embeds a file of documents through a
running Ivy gateway, resumably. This package talks to Ivy over HTTP only: it
imports nothing from ROSE or Tulip, so it runs on any machine that can reach
the gateway."""
