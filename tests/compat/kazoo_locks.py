"""kazoo (Python) takes and releases its Lock, ReadLock and WriteLock on a ZooKeeper-protocol server.

    python3 tests/compat/kazoo_locks.py HOST:PORT

Checks: mutual exclusion of Lock across threads (each its own session), readers sharing, a writer
excluding readers, timeouts raising LockTimeout, and no lock nodes left behind. Exits non-zero on
any failure.
"""
import sys
import threading
import uuid

from kazoo.client import KazooClient
from kazoo.exceptions import LockTimeout

hosts = sys.argv[1]
base = "/kazoo-compat-" + uuid.uuid4().hex


def client():
    c = KazooClient(hosts=hosts, timeout=10)
    c.start(timeout=10)
    return c


def check_mutex():
    path = base + "/mutex"
    inside = []
    overlaps = []
    guard = threading.Lock()

    def worker(n):
        c = client()
        lock = c.Lock(path, "worker-%d" % n)
        for _ in range(10):
            with lock:
                with guard:
                    inside.append(n)
                    if len(inside) > 1:
                        overlaps.append(list(inside))
                with guard:
                    inside.remove(n)
        c.stop()
        c.close()

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
        assert not t.is_alive(), "a kazoo worker hung"
    assert not overlaps, "Lock holders overlapped: %r" % overlaps


def check_rw_and_timeouts():
    a, b = client(), client()
    path = base + "/rw"
    r1 = a.ReadLock(path)
    r2 = b.ReadLock(path)
    assert r1.acquire(timeout=10)
    assert r2.acquire(timeout=10), "readers must share"
    w = b.WriteLock(path)
    try:
        w.acquire(timeout=0.5)
        raise AssertionError("a writer entered beside readers")
    except LockTimeout:
        pass
    r1.release()
    r2.release()
    assert w.acquire(timeout=10)
    r3 = a.ReadLock(path)
    assert not r3.acquire(blocking=False), "a reader entered beside a writer"
    w.release()
    assert r3.acquire(timeout=10)
    r3.release()
    lock = a.Lock(base + "/mutex")
    assert lock.acquire(timeout=10)
    other = b.Lock(base + "/mutex")
    assert not other.acquire(blocking=False)
    lock.release()
    for p in (base + "/rw", base + "/mutex"):
        left = a.get_children(p)
        assert left == [], "nodes left behind in %s: %r" % (p, left)
    a.delete(base, recursive=True)
    a.stop(); a.close(); b.stop(); b.close()


def check_version_and_transactions():
    """kazoo reads the server's version from `envi` (its transactions need it) and parses its
    leading x.y.z; a transaction then commits atomically."""
    c = client()
    version = c.server_version()
    assert version[:2] >= (3, 4), "server_version() = %r" % (version,)
    path = base + "/txn"
    c.ensure_path(path)
    t = c.transaction()
    t.create(path + "/a", b"1")
    t.check(path, 0)
    t.create(path + "/b", b"2")
    results = t.commit()
    assert results == [path + "/a", True, path + "/b"], results
    c.delete(base, recursive=True)
    c.stop(); c.close()


check_mutex()
check_rw_and_timeouts()
check_version_and_transactions()
print("kazoo: Lock, ReadLock, WriteLock, server_version, transactions OK on", hosts)
