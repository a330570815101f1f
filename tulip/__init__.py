"""Tulip: the gRPC inference server (Rust, in ``tulip._native``) and its
Python launcher. ``python -m tulip --help`` lists the flags."""

__all__ = ["serve"]


def serve(engine, **options) -> None:
    """Serves a ROSE engine until Ctrl-C or SIGTERM (see ``tulip._native.serve``)."""
    from rose.interface import InvalidBatchError

    from ._native import serve as _serve

    _serve(engine, InvalidBatchError, **options)
