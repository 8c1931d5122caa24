"""A function run in a forked child process, its result back through a pipe (the layout
search's full simulations and block probes).

Each simulation's fake world lives and dies in its own process: DTensor caches sharding
decisions by device meshes, which compare equal across worlds whatever their process groups,
so a second world in one process gets plans naming the first one's destroyed groups."""

from __future__ import annotations


def in_child(fn):
    """fn() in a forked child process (module docstring); its exception comes back as a
    RuntimeError with the child's traceback."""
    import multiprocessing
    import traceback

    ctx = multiprocessing.get_context("fork")
    receive, send = ctx.Pipe(duplex=False)

    def child():
        try:
            send.send(("ok", fn()))
        except BaseException as e:  # broad on purpose: the parent re-raises it, traceback and all
            send.send(("error", f"{type(e).__name__}: {e}\n{traceback.format_exc()}"))
        finally:
            send.close()

    proc = ctx.Process(target=child)
    proc.start()
    send.close()
    try:
        status, value = receive.recv()
    except EOFError:
        status, value = (
            "error",
            f"the simulation process died (exit code {proc.join() or proc.exitcode})",
        )
    proc.join()
    if status != "ok":
        raise RuntimeError(f"layout search: a full simulation failed: {value}")
    return value
