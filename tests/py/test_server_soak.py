"""A short soak (bench/serve_soak.py): clients sending a random mix of requests - good ones of
every API, ones they give up on midway, and bad ones of every kind - for half a minute. Every
answer must be what it should be; afterwards the server is idle, answers a fixed greedy
request exactly as before, its memory has stopped growing (caches kept small here, so that
growth would be a leak) and it exits cleanly (a sanitized build: no leak, no error)."""
import os
import sys

from server_util import REPO, Server
from test_server_vision import tiny_vl_model

sys.path.insert(0, os.path.join(REPO, "bench"))
from serve_soak import Soak  # noqa: E402

SECONDS = float(os.environ.get("TS_SOAK_SECONDS", "30"))


def test_a_mixed_load_leaves_the_server_as_it_found_it():
    with Server("--parallel", "3", "--max-pending", "6", "--cache-mb", "8",
                "--responses-store-mb", "1") as srv:
        report = Soak(srv.base, SECONDS, clients=6, seed=7, pid=srv.proc.pid).run()
        assert report["n_failures"] == 0, report
        missing = [name for name, _, _ in Soak.OPS if name not in report["ops"]]
        assert not missing, report
        # 6 clients for 3 lanes and 3 places in the queue: some are refused with 503
        assert sum(v["refused_503"] for v in report["ops"].values()) > 0, report
        if not os.environ.get("TS_SERVER_BIN"):  # a sanitizer's allocator keeps freed memory
            assert report["rss_growth_mb"] is not None and report["rss_growth_mb"] < 16, report


def test_a_mixed_load_with_pictures():
    """The same with a model that reads images: pictures of random sizes, repeated ones,
    broken ones, beside the rest."""
    with Server("--parallel", "2", "--max-pending", "4", "--cache-mb", "16",
                model=tiny_vl_model()) as srv:
        report = Soak(srv.base, SECONDS / 2, clients=4, seed=11, pid=srv.proc.pid).run()
        assert report["n_failures"] == 0, report
        assert report["ops"].get("image", {}).get("done", 0) > 0, report
