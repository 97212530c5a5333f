"""The production worker's quick shutdown (SIGINT/SIGQUIT) leaves the worker even when the signal
lands while the main thread is inside ``ThreadPoolExecutor.submit`` holding the pool's lock, which
is where gunicorn's own threaded worker waits forever (seen as a gunicorn that did not stop within
20 s of SIGINT on a loaded 2-core machine)."""

from __future__ import annotations

import ast
import gc
import os
import selectors
import signal
import socket
import threading
import time
from types import SimpleNamespace
from typing import Any

from gunicorn.config import Config
from gunicorn.workers.gthread import TConn

from app import gunicorn_worker
from app.gunicorn_worker import ConnectionBoard, Logger, ThreadWorker
from tests.support.apps import ROOT

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


# ---------------------------------------------------------------- connections shared out evenly


def test_the_board_gives_the_fewest_connections_of_the_other_live_workers():
    board = ConnectionBoard()
    now = 1000.0
    assert board.fewest_elsewhere(0, now) is None  # no other worker
    board.publish(0, 1, now)  # our own slot never counts
    assert board.fewest_elsewhere(0, now) is None
    board.publish(1, 7, now)
    board.publish(2, 3, now - 0.5)
    assert board.fewest_elsewhere(0, now) == 3
    assert board.fewest_elsewhere(2, now) == 1
    board.publish(3, 0, now - ConnectionBoard.STALE)  # not written for too long: no live worker
    assert board.fewest_elsewhere(0, now) == 3
    board.leave(2)  # full, or stopping
    assert board.fewest_elsewhere(0, now) == 7


def listening_worker(age: int) -> tuple[ThreadWorker, socket.socket]:
    listener = socket.create_server(("127.0.0.1", 0))
    worker = ThreadWorker(
        age=age, ppid=os.getppid(), sockets=[listener], app=None, timeout=30, cfg=Config(), log=None
    )
    worker.poller = selectors.DefaultSelector()
    return worker, listener


def listens(worker: ThreadWorker, listener: socket.socket) -> bool:
    return listener in {key.fileobj for key in worker.poller.get_map().values()}


def test_a_worker_with_more_connections_leaves_a_new_one_to_the_others_for_a_while(monkeypatch):
    board = ConnectionBoard()
    monkeypatch.setattr(gunicorn_worker, "BOARD", board)
    worker, listener = listening_worker(age=5)
    with listener:
        worker.set_accept_enabled(True)
        assert listens(worker, listener)
        worker.nr_conns = 4
        now = 50.0
        board.publish(6, 3, now)  # another worker one connection short of us: we take it
        assert worker._leave_to_others(now) is False
        board.publish(6, 2, now)  # another worker has two fewer: left to it, our listener out
        assert worker._leave_to_others(now) is True
        assert not listens(worker, listener)
        # Our next turn after RECHECK puts the listener back and looks again.
        worker._paused_until = 0.0
        worker.set_accept_enabled(True)
        assert listens(worker, listener)
        assert worker._leave_to_others(now + ThreadWorker.DEFER / 2) is True
        # Nobody took it within DEFER: we do.
        assert worker._leave_to_others(now + ThreadWorker.DEFER) is False
        # A connection arriving long after is a new one: left to the others again.
        board.publish(6, 2, now + 10)
        assert worker._leave_to_others(now + 10) is True
        # Unless they stopped writing on the board (a worker gone).
        assert worker._leave_to_others(now + 10 + ConnectionBoard.STALE) is False


def test_the_worker_publishes_its_connections_while_it_accepts_and_leaves_when_it_stops(
    monkeypatch,
):
    board = ConnectionBoard()
    monkeypatch.setattr(gunicorn_worker, "BOARD", board)
    worker, listener = listening_worker(age=2)
    with listener:
        worker.set_accept_enabled(True)
        worker.nr_conns = 9
        worker.wait_for_and_dispatch_events(0.0)
        assert board.fewest_elsewhere(0, time.monotonic()) == 9
        worker.set_accept_enabled(False)
        worker.wait_for_and_dispatch_events(0.0)
        assert board.fewest_elsewhere(0, time.monotonic()) is None
        assert not listens(worker, listener)


# ---------------------------------------------------------------- a kept-alive connection's next request


def hello(environ: dict[str, Any], start_response: Any) -> list[bytes]:
    start_response("200 OK", [("Content-Type", "text/plain"), ("Content-Length", "2")])
    return [b"ok"]


REQUEST = b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"


def serving_worker(linger: float) -> ThreadWorker:
    config = Config()
    worker = ThreadWorker(
        age=1, ppid=os.getppid(), sockets=[], app=None, timeout=30, cfg=config, log=Logger(config)
    )
    worker.wsgi = hello
    worker.LINGER = linger  # type: ignore[misc]
    return worker


def answers(client: socket.socket, count: int) -> int:
    """Read until ``count`` whole answers came (each ends with its 2-byte body)."""
    got = b""
    while got.count(b"HTTP/1.1 200 OK") < count or not got.endswith(b"ok"):
        chunk = client.recv(65536)
        assert chunk, got
        got += chunk
    return got.count(b"HTTP/1.1 200 OK")


def test_the_next_request_on_a_kept_alive_connection_is_served_by_the_same_thread():
    worker = serving_worker(linger=SAFETY_NET)  # waits as long as it takes: no timing here
    server_side, client = socket.socketpair()
    conn = TConn(worker.cfg, server_side, ("127.0.0.1", 1), ("127.0.0.1", 2))
    conn.data_ready = True

    def client_side() -> None:
        client.sendall(REQUEST)
        assert answers(client, 1) == 1
        client.sendall(REQUEST)  # after the first answer: the thread is waiting for it
        assert answers(client, 1) == 1
        client.shutdown(socket.SHUT_WR)  # then the client is done

    with client, server_side:
        other = threading.Thread(target=client_side, daemon=True)
        other.start()
        keep = worker.handle(conn)
        other.join(SAFETY_NET)
    assert worker.nr == 2  # both in the one call
    assert keep is False  # the client closed: nothing to hand back to the poller


def test_a_connection_without_a_next_request_goes_back_to_the_poller():
    worker = serving_worker(linger=0.01)
    server_side, client = socket.socketpair()
    conn = TConn(worker.cfg, server_side, ("127.0.0.1", 1), ("127.0.0.1", 2))
    conn.data_ready = True
    with client, server_side:
        client.sendall(REQUEST)
        keep = worker.handle(conn)
        assert answers(client, 1) == 1
    assert keep is True and worker.nr == 1


def test_a_started_worker_freezes_what_it_holds_out_of_the_collector(monkeypatch):
    """post_worker_init: the start-up first, then ``gc.freeze()``, so that a full collection
    does not traverse the modules and the app while every thread of the worker waits."""
    tree = ast.parse((ROOT / "gunicorn.conf.py").read_text())
    hook = next(
        n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "post_worker_init"
    )
    namespace: dict[str, object] = {"gc": gc}
    exec(compile(ast.Module(body=[hook], type_ignores=[]), "gunicorn.conf.py", "exec"), namespace)
    started: list[object] = []
    monkeypatch.setattr("app.startup", lambda wsgi: started.append((wsgi, gc.get_freeze_count())))
    worker = SimpleNamespace(wsgi=object())
    assert gc.get_freeze_count() == 0
    try:
        namespace["post_worker_init"](worker)  # type: ignore[operator]
        assert started == [(worker.wsgi, 0)]  # frozen after the start-up, not before
        assert gc.get_freeze_count() > 0
    finally:
        gc.unfreeze()
