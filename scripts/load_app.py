"""Load test of the demo: many users asking questions at once through `gradio_client`, as real users would.

    python scripts/load_app.py --checkpoint runs/tiny                         # 20 users x 5 questions, defaults
    python scripts/load_app.py --checkpoint runs/tiny --users 100 --questions 2   # overload: refusals must be friendly
    python scripts/load_app.py --url http://127.0.0.1:7860/                  # an app already running
    python scripts/load_app.py --checkpoint runs/tiny --app OLD/app.py       # another copy of the app (before/after)
    python scripts/load_app.py --checkpoint runs/tiny -- --max-batch 8       # options after `--` go to app.py
    python scripts/load_app.py --checkpoint runs/tiny --explorer-users 200  # then 200 explorer users
    python scripts/load_app.py --checkpoint runs/tiny --explorer-users 100 --explorer-rounds 3  # 3 rounds of 100

With --checkpoint the app is started as its own process (`python app.py --checkpoint RUN --port P`), so the
users' threads here do not share an interpreter with the server. Steps, in one run:

1. warm-up: two questions;
2. alone: `--alone` questions one after another by one user: the latency of one request alone (median);
3. at once: `--users` users, each its own `gradio_client.Client`, all asking their
   `--questions` questions at the same moment, each user's next question when its previous one returns.
   Pictures and questions are mixed (vqa/samples and, when built, Shapes val scenes).

4. with `--explorer-users N`: N more users, one after another, each asking one question, opening the
   attention explorer (/explain) and closing; the server's resident memory (RSS) is read before and after
   (with `--explorer-rounds R`, after each of R rounds of N users: a plateau or growth per user).

Every request ends one of three ways: answered; refused with a message meant for a person (the queue is full:
gradio_client's "Queue is full! Please try again.", the page's "This application is currently busy", or the
app's own busy message); or an error (anything else: a connection reset, a server error, a timeout).
Prints the figures and, with --json FILE, writes them. Exit status 1 when any request ended in an error, or
with --targets when the issue-15 targets are missed (none refused; wall time <= 0.3 x (n x alone latency);
median <= 1 s).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHAPES_QUESTIONS = ["what color is the large triangle?", "how many objects are there?", "is there a circle?",
                    "what shape is the red object?", "is the circle left of the square?"]
# a refusal meant for a person: gradio_client's queue-full error, the page's busy text, the app's own message
FRIENDLY = re.compile(r"Queue is full|currently busy|The demo is busy", re.I)


def workload(n: int, seed: int = 0) -> list[tuple[str, str]]:
    """n (picture path, question) pairs, mixed: the sample pictures with their questions, Shapes val scenes
    (if data/shapes is built) with Shapes questions."""
    import random

    pairs = []
    meta = ROOT / "vqa" / "samples" / "samples.json"
    if meta.is_file():
        for e in json.loads(meta.read_text()):
            pairs.append((str(ROOT / "vqa" / "samples" / e["file"]), e["question"]))
    val = ROOT / "data" / "shapes" / "val"
    if val.is_dir():
        for i, p in enumerate(sorted(val.glob("*.png"))[:12]):
            pairs.append((str(p), SHAPES_QUESTIONS[i % len(SHAPES_QUESTIONS)]))
    if not pairs:
        raise SystemExit("load_app.py: no pictures found in vqa/samples or data/shapes/val")
    rng = random.Random(seed)
    return [rng.choice(pairs) for _ in range(n)]


def start_app(app: Path, checkpoint: str, extra: list[str], timeout: float = 180.0) -> tuple[subprocess.Popen, str]:
    """Start `python APP --checkpoint RUN --port P EXTRA...` and wait for the address it prints."""
    port = _free_port()
    env = dict(os.environ, PYTHONPATH=str(app.parent), PYTHONUNBUFFERED="1")
    cmd = [sys.executable, str(app), "--checkpoint", checkpoint, "--port", str(port), *extra]
    proc = subprocess.Popen(cmd, cwd=app.parent, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    lines, deadline = [], time.monotonic() + timeout
    assert proc.stdout is not None
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        lines.append(line)
        m = re.search(r"serving .* at (http://\S+)", line)
        if m:
            threading.Thread(target=_drain, args=(proc.stdout,), daemon=True).start()
            return proc, m.group(1)
    proc.kill()
    raise SystemExit("load_app.py: the app did not start:\n" + "".join(lines[-30:]))


def _drain(stream) -> None:
    for _ in stream:  # keep the app's output pipe from filling up
        pass


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cpu_seconds(pid: int | None = None) -> float | None:
    """CPU time (user + system) used so far by process `pid` (Linux /proc), or by this process; None where
    it cannot be read."""
    if pid is None:
        t = os.times()
        return t.user + t.system
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


def ask(client, picture: str, question: str, top_k: int) -> tuple[str, float, str]:
    """One /ask request: (outcome, seconds, detail); outcome is 'ok', 'refused' or 'error'."""
    from gradio_client import handle_file

    t0 = time.perf_counter()
    try:
        out = client.predict(handle_file(picture), question, top_k, api_name="/ask")
        outcome, detail = ("ok", out[0]) if isinstance(out, (list, tuple)) and isinstance(out[0], str) else (
            "error", f"unexpected output {out!r:.200}")
    except Exception as e:  # classify, never crash the load test
        msg = f"{type(e).__name__}: {e}"
        outcome, detail = ("refused" if FRIENDLY.search(msg) else "error"), msg
    return outcome, time.perf_counter() - t0, detail


_TLS = {}


def _client(url: str):
    """A gradio_client Client. All share one TLS context: gradio_client otherwise builds a fresh one (reading
    every CA certificate) for each request, which on a 2-core machine costs more CPU than the server spends
    answering (the context is unused for http:// and verifies as usual for https://)."""
    import ssl

    import certifi
    from gradio_client import Client

    if "ctx" not in _TLS:
        _TLS["ctx"] = ssl.create_default_context(cafile=certifi.where())
    return Client(url, verbose=False, download_files=False, ssl_verify=_TLS["ctx"])


def run_alone(url: str, n: int, top_k: int) -> list[float]:
    """Latencies of n questions asked one after another by one user (after two warm-up questions)."""
    client, jobs = _client(url), workload(n + 2, seed=1)
    out = []
    for i, (pic, q) in enumerate(jobs):
        outcome, secs, detail = ask(client, pic, q, top_k)
        if outcome != "ok":
            raise SystemExit(f"load_app.py: a question alone failed: {detail}")
        if i >= 2:
            out.append(secs)
    return out


def run_at_once(url: str, users: int, questions: int, top_k: int, server_pid: int | None = None) -> dict:
    """`users` clients asking `questions` questions each, all starting together. With `server_pid`, also the
    CPU seconds the server and these clients used meanwhile (they share the machine)."""
    clients = [None] * users

    def connect(i):
        for attempt in range(5):  # a client's set-up is not part of the measurement: retry it
            try:
                clients[i] = _client(url)
                return
            except Exception:
                time.sleep(0.5 * (attempt + 1))
        clients[i] = _client(url)

    threads = [threading.Thread(target=connect, args=(i,)) for i in range(users)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    jobs = workload(users * questions, seed=2)
    results: list[tuple[str, float, str]] = []
    lock, start = threading.Lock(), threading.Barrier(users + 1)

    def user(i):
        start.wait()
        for j in range(questions):
            pic, q = jobs[i * questions + j]
            r = ask(clients[i], pic, q, top_k)
            with lock:
                results.append(r)

    threads = [threading.Thread(target=user, args=(i,)) for i in range(users)]
    for t in threads:
        t.start()
    start.wait()
    t0, cpu_server0, cpu_clients0 = time.perf_counter(), cpu_seconds(server_pid), cpu_seconds()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    cpu_server = cpu_seconds(server_pid) if server_pid is not None and cpu_server0 is not None else None
    cpu_clients = cpu_seconds() - cpu_clients0
    for c in clients:
        try:
            c.close()
        except Exception:
            pass
    ok = sorted(s for o, s, _ in results if o == "ok")
    errors = [d for o, _, d in results if o == "error"]
    refusals = [d for o, _, d in results if o == "refused"]
    return dict(users=users, questions=questions, requests=len(results), answered=len(ok), refused=len(refusals),
                errors=len(errors), wall_s=wall, median_s=statistics.median(ok) if ok else None,
                p95_s=ok[min(len(ok) - 1, int(0.95 * len(ok)))] if ok else None,
                error_examples=sorted(set(errors))[:5], refusal_examples=sorted(set(refusals))[:3],
                cpu_server_s=None if cpu_server is None else cpu_server - cpu_server0, cpu_clients_s=cpu_clients)


def rss_mib(pid: int | None) -> float | None:
    """The resident memory of process `pid` in MiB (Linux /proc), None where it cannot be read."""
    if pid is None:
        return None
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def run_explorer_users(url: str, n: int, server_pid: int | None = None, rounds: int = 1) -> dict:
    """`rounds` rounds of n users one after another, each asking a question, opening the explorer and
    closing: how many worked and the server's RSS before and after each round (every user's state is still
    within its time to live). Growth that stops after the first round is a high-water mark; growth by the
    same amount every round is memory kept per user."""
    jobs = workload(n, seed=3)
    before, failed, after_rounds = rss_mib(server_pid), [], []
    for _ in range(rounds):
        for pic, q in jobs:
            client = _client(url)
            try:
                if ask(client, pic, q, 3)[0] != "ok":
                    raise RuntimeError("the question was not answered")
                client.predict(api_name="/explain")
            except Exception as e:  # count it, go on
                failed.append(f"{type(e).__name__}: {e}")
            finally:
                client.close()
        after_rounds.append(rss_mib(server_pid))
    after = after_rounds[-1]
    grew = None if before is None or after is None else after - before
    later = None if rounds < 2 or None in after_rounds else after_rounds[-1] - after_rounds[0]
    return dict(explorer_users=n, explorer_rounds=rounds, explorer_failed=len(failed),
                explorer_failures=sorted(set(failed))[:3], rss_before_users_mib=before,
                rss_after_users_mib=after, rss_growth_mib=grew, rss_after_rounds_mib=after_rounds,
                rss_growth_after_first_round_mib=later)


def report(alone: list[float], burst: dict) -> dict:
    single = statistics.median(alone)
    n = burst["requests"]
    out = dict(alone_median_s=single, alone_n=len(alone), **burst)
    out["one_after_another_s"] = n * single
    out["wall_over_one_after_another"] = burst["wall_s"] / (n * single)
    return out


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    extra = []
    if "--" in argv:
        i = argv.index("--")
        argv, extra = argv[:i], argv[i + 1 :]
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--checkpoint", metavar="RUN", help="start the app on this run (its own process)")
    src.add_argument("--url", help="an app already running, e.g. http://127.0.0.1:7860/")
    p.add_argument("--app", default=str(ROOT / "app.py"), help="the app.py to start (default: this repository's)")
    p.add_argument("--users", type=int, default=20, help="users asking at once (default 20)")
    p.add_argument("--questions", type=int, default=5, help="questions each user asks, one after another (default 5)")
    p.add_argument("--alone", type=int, default=10, help="questions asked alone to time one request (default 10)")
    p.add_argument("--top-k", type=int, default=3, help="the /ask top-k (default 3, the app's own default)")
    p.add_argument("--explorer-users", type=int, default=0, metavar="N",
                   help="then N users, one after another, that ask, open the explorer and close; prints the "
                        "server's memory growth (RSS, with --checkpoint)")
    p.add_argument("--explorer-rounds", type=int, default=1, metavar="R",
                   help="run the N explorer users R times over, the RSS read after each round (default 1)")
    p.add_argument("--json", metavar="FILE", help="also write the figures to FILE")
    p.add_argument("--targets", action="store_true",
                   help="exit 1 unless none is refused, wall <= 0.3 x one-after-another and median <= 1 s")
    args = p.parse_args(argv)
    if args.explorer_rounds < 1:
        p.error(f"--explorer-rounds must be at least 1, got {args.explorer_rounds}")

    proc = None
    if args.checkpoint:
        proc, url = start_app(Path(args.app).resolve(), args.checkpoint, extra)
    else:
        url = args.url
    try:
        alone = run_alone(url, args.alone, args.top_k)
        burst = run_at_once(url, args.users, args.questions, args.top_k, proc.pid if proc is not None else None)
        if args.explorer_users > 0:
            burst.update(run_explorer_users(url, args.explorer_users, proc.pid if proc is not None else None,
                                            args.explorer_rounds))
    finally:
        if proc is not None:
            proc.terminate()
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
    fig = report(alone, burst)
    fig["app_options"] = extra
    print(f"one request alone: median {fig['alone_median_s']:.3f} s over {fig['alone_n']}")
    print(f"{fig['users']} users x {fig['questions']} questions at once: {fig['answered']} answered, "
          f"{fig['refused']} refused, {fig['errors']} errors")
    if fig["median_s"] is not None:
        print(f"latency of the answered: median {fig['median_s']:.3f} s, p95 {fig['p95_s']:.3f} s")
    print(f"wall time {fig['wall_s']:.2f} s = {fig['wall_over_one_after_another']:.2f} x asking the "
          f"{fig['requests']} one after another ({fig['one_after_another_s']:.2f} s)")
    cpu = f"the clients here {fig['cpu_clients_s']:.1f} s"
    if fig["cpu_server_s"] is not None:
        cpu = f"the server {fig['cpu_server_s']:.1f} s, " + cpu
    print(f"CPU time meanwhile: {cpu} ({os.cpu_count()} cores)")
    if fig.get("explorer_users"):
        rss = ""
        if fig["rss_growth_mib"] is not None:
            rss = (f": server RSS {fig['rss_before_users_mib']:.0f} -> {fig['rss_after_users_mib']:.0f} MiB "
                   f"({fig['rss_growth_mib']:+.0f} MiB)")
        rounds = fig["explorer_rounds"]
        print(f"{fig['explorer_users']} explorer users{f' x {rounds} rounds' if rounds > 1 else ''} opened and "
              f"closed, {fig['explorer_failed']} failed{rss}")
        if rounds > 1 and fig["rss_growth_after_first_round_mib"] is not None:
            each = ", ".join(f"{r:.0f}" for r in fig["rss_after_rounds_mib"])
            print(f"  server RSS after each round: {each} MiB ({fig['rss_growth_after_first_round_mib']:+.0f} MiB "
                  "after the first)")
        for d in fig["explorer_failures"]:
            print(f"  ERROR: {d}")
    for d in fig["refusal_examples"]:
        print(f"  refused: {d}")
    for d in fig["error_examples"]:
        print(f"  ERROR: {d}")
    if args.json:
        Path(args.json).write_text(json.dumps(fig, indent=2) + "\n")
    failed = fig["errors"] > 0 or fig.get("explorer_failed", 0) > 0
    if args.targets:
        misses = []
        if fig["refused"]:
            misses.append(f"{fig['refused']} refused")
        if fig["wall_over_one_after_another"] > 0.3:
            misses.append(f"wall {fig['wall_over_one_after_another']:.2f} x > 0.3 x")
        if fig["median_s"] is None or fig["median_s"] > 1.0:
            misses.append(f"median {fig['median_s']} s > 1 s")
        for m in misses:
            print(f"target missed: {m}")
        failed = failed or bool(misses)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
