#!/usr/bin/env python3
"""Redis' own time per call of the decision script, two versions side by side.

Runs the same EVALSHA calls (the same keys, costs and injected times) through
each script given, on a private redis-server on an ephemeral loopback port,
and reads Redis' time per call from INFO commandstats (usec_per_call: the
script's run inside Redis, without the network). Rounds alternate the
scripts, so the machine's swings hit both alike; the ratio of each row is
taken within a round. Workloads, strict, for each bucket count given:

  distinct     100 000 keys, 3 passes, 10 us apart (limit 100 a minute)
  hot allowed  one key under its limit, 200 000 calls
  hot denied   one key over its limit, 200 000 calls
  span         1 000 keys, each checked every half bucket (records across
               the whole span)

Usage (from the repository's root; needs redis-server and redis-cli):

  git show <rev>:src/redis/check.lua > /tmp/before.lua
  python3 benches/support/script_cpu.py /tmp/before.lua src/redis/check.lua
  ROUNDS=5 BUCKETS="7 15" python3 benches/support/script_cpu.py A.lua B.lua
"""
import os
import socket
import subprocess
import sys
import tempfile
import time

WINDOW_US = 60_000_000
START_US = 1_700_000_000_000_000


def resp(*args):
    out = [b"*%d\r\n" % len(args)]
    for a in args:
        a = a if isinstance(a, bytes) else str(a).encode()
        out.append(b"$%d\r\n%s\r\n" % (len(a), a))
    return b"".join(out)


def calls(sha, prefix, workload, n):
    """The workload's EVALSHA calls: KEYS[1], then limit, N, width, cost,
    interpolated, now (us)."""
    w = WINDOW_US // n
    t = START_US
    if workload == "distinct":
        for _ in range(3):
            for k in range(100_000):
                t += 10
                yield resp("EVALSHA", sha, 1, f"{prefix}:{k}", 100, n, w, 1, 0, t)
    elif workload in ("hot allowed", "hot denied"):
        limit = 10_000_000 if workload == "hot allowed" else 100
        for _ in range(200_000):
            t += 10
            yield resp("EVALSHA", sha, 1, f"{prefix}:hot", limit, n, w, 1, 0, t)
    elif workload == "span":
        for _ in range(200):
            t += w // 2
            for k in range(1000):
                yield resp("EVALSHA", sha, 1, f"{prefix}:{k}", 1000, n, w, 1, 0, t + k)


def main():
    scripts = sys.argv[1:]
    if len(scripts) < 2:
        sys.exit(__doc__)
    rounds = int(os.environ.get("ROUNDS", "3"))
    buckets = [int(b) for b in os.environ.get("BUCKETS", "7 15").split()]
    workloads = ["distinct", "hot allowed", "hot denied", "span"]
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    server = subprocess.Popen(
        ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
         "--appendonly", "no"], stdout=subprocess.DEVNULL)
    cli = ["redis-cli", "-p", str(port)]
    try:
        for _ in range(100):
            if subprocess.run(cli + ["PING"], capture_output=True).stdout.strip() == b"PONG":
                break
            time.sleep(0.05)
        shas = [subprocess.run(cli + ["SCRIPT", "LOAD", open(p).read()], capture_output=True,
                               check=True, text=True).stdout.strip() for p in scripts]
        with tempfile.TemporaryDirectory() as tmp:
            files = {}
            for i, sha in enumerate(shas):
                for n in buckets:
                    for wl in workloads:
                        path = os.path.join(tmp, f"{i}-{n}-{wl}")
                        with open(path, "wb") as f:
                            for c in calls(sha, f"s{i}", wl, n):
                                f.write(c)
                        files[i, n, wl] = path
            per_call = {}
            for r in range(rounds):
                for n in buckets:
                    for wl in workloads:
                        for i in range(len(scripts)):
                            subprocess.run(cli + ["FLUSHALL"], capture_output=True, check=True)
                            subprocess.run(cli + ["CONFIG", "RESETSTAT"], capture_output=True,
                                           check=True)
                            with open(files[i, n, wl], "rb") as f:
                                subprocess.run(cli + ["--pipe"], stdin=f, capture_output=True,
                                               check=True)
                            stats = subprocess.run(cli + ["INFO", "commandstats"],
                                                   capture_output=True, text=True).stdout
                            line = next(l for l in stats.splitlines()
                                        if l.startswith("cmdstat_evalsha:"))
                            fields = dict(kv.split("=") for kv in line.split(":", 1)[1].split(","))
                            if int(fields.get("failed_calls", "0")) or int(
                                    fields.get("rejected_calls", "0")):
                                sys.exit(f"{scripts[i]}: calls failed: {line}")
                            per_call.setdefault((n, wl, i), []).append(
                                float(fields["usec_per_call"]))
        names = [os.path.basename(p) for p in scripts]
        print(f"Redis' time per call (us, median of {rounds} rounds); ratio to {names[0]}, "
              "median of the rounds' ratios\n")
        print("| buckets | workload | " + " | ".join(names) + " | "
              + " | ".join(f"{x} / {names[0]}" for x in names[1:]) + " |")
        print("|---:|---|" + "---:|" * (2 * len(names) - 1))
        med = lambda v: sorted(v)[len(v) // 2]
        for n in buckets:
            for wl in workloads:
                base = per_call[n, wl, 0]
                cells = [f"{med(per_call[n, wl, i]):.2f}" for i in range(len(scripts))]
                ratios = [f"{med([x / b for x, b in zip(per_call[n, wl, i], base)]):.3f}"
                          for i in range(1, len(scripts))]
                print(f"| {n} | {wl} | " + " | ".join(cells) + " | " + " | ".join(ratios) + " |")
    finally:
        subprocess.run(cli + ["SHUTDOWN", "NOSAVE"], capture_output=True)
        server.wait(timeout=10)


if __name__ == "__main__":
    main()
