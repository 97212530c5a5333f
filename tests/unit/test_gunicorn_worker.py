"""The production worker's quick shutdown (SIGINT/SIGQUIT) leaves the worker even when the signal
lands while the main thread is inside ``ThreadPoolExecutor.submit`` holding the pool's lock, which
is where gunicorn's own threaded worker waits forever (seen as a gunicorn that did not stop within
20 s of SIGINT on a loaded 2-core machine)."""

from __future__ import annotations

import ast
import os
import signal
import threading

from gunicorn.config import Config

from app.gunicorn_worker import ThreadWorker
from tests.apps import ROOT

SAFETY_NET = 60  # seconds; the handler itself returns in about 0.1 s (gunicorn's pause before exit)


def a_worker() -> ThreadWorker:
    worker = ThreadWorker(
        age=1, ppid=os.getppid(), sockets=[], app=None, timeout=30, cfg=Config(), log=None
    )
    worker.tpool = worker.get_thread_pool()
    return worker


def test_a_quick_shutdown_inside_submit_raises_system_exit_instead_of_waiting_for_the_pool():
    worker = a_worker()
    outcome: list[BaseException] = []

    def the_signal_arrives() -> None:
        try:
            worker.handle_quit(signal.SIGQUIT, None)
        except BaseException as exc:
            outcome.append(exc)

    # What the main thread holds in the middle of submit() when the handler interrupts it.
    with worker.tpool._shutdown_lock:
        handler = threading.Thread(target=the_signal_arrives, daemon=True)
        handler.start()
        handler.join(SAFETY_NET)
        finished = not handler.is_alive()
    assert finished, "the quick-shutdown handler waited for the thread pool's lock"
    assert len(outcome) == 1 and isinstance(outcome[0], SystemExit), outcome
    assert outcome[0].code == 0
    assert worker.alive is False


def test_the_pool_stays_usable_until_the_interpreter_exits():
    worker = a_worker()
    try:
        worker.handle_quit(signal.SIGQUIT, None)
    except SystemExit:
        pass
    # A request already handed to the pool still runs (the exit joins the pool's threads).
    assert worker.tpool.submit(lambda: 41 + 1).result(SAFETY_NET) == 42
    worker.tpool.shutdown(wait=True)


def test_production_runs_this_worker():
    tree = ast.parse((ROOT / "gunicorn.conf.py").read_text())
    setting = next(
        node.value
        for node in tree.body
        if isinstance(node, ast.Assign) and ast.unparse(node.targets[0]) == "worker_class"
    )
    config = Config()
    config.set("worker_class", ast.literal_eval(setting))
    assert config.worker_class is ThreadWorker
