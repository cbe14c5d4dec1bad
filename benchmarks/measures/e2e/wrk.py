"""wrk for the e2e measure: the Lua script that sends the control project's requests, one
run, and the check of what the route answered."""

from __future__ import annotations

import json
import shutil
import subprocess
import uuid
from typing import Any

from benchmarks.harness.control import BODY, TOKEN

WRK_SCRIPT = r"""
-- A fresh Idempotency-Key per request (mode "fresh"), one key for all ("replay"), or
-- none ("plain").
local threads = {}
local count = 0

function setup(thread)
  count = count + 1
  thread:set("tid", count)
  table.insert(threads, thread)
end

function init(args)
  run = args[1]
  mode = args[2]
  body = args[3]
  sent = 0
  created = 0
  replayed = 0
  conflicts = 0
  other = 0
  other_status = 0
end

function request()
  sent = sent + 1
  local headers = {
    ["Content-Type"] = "application/json",
    ["Authorization"] = "Token __TOKEN__",
  }
  if mode == "replay" then
    headers["Idempotency-Key"] = run .. "-replay"
  elseif mode == "fresh" then
    headers["Idempotency-Key"] = run .. "-" .. tid .. "-" .. sent
  end
  return wrk.format("POST", nil, headers, body)
end

function response(status, headers, body)
  if status == 201 then
    if headers["Idempotent-Replayed"] then
      replayed = replayed + 1
    else
      created = created + 1
    end
  elseif status == 409 then
    conflicts = conflicts + 1
  else
    other = other + 1
    other_status = status
  end
end

function done(summary, latency, requests)
  local created, replayed, conflicts, other, other_status = 0, 0, 0, 0, 0
  for _, thread in ipairs(threads) do
    created = created + thread:get("created")
    conflicts = conflicts + thread:get("conflicts")
    replayed = replayed + thread:get("replayed")
    other = other + thread:get("other")
    if thread:get("other_status") ~= 0 then other_status = thread:get("other_status") end
  end
  io.write(string.format(
    'WRKJSON {"requests": %d, "duration_us": %d, "created": %d, "replayed": %d, '
    .. '"conflicts": %d, "other": %d, "other_status": %d, "socket_errors": %d, '
    .. '"p50_us": %d, "p99_us": %d}\n',
    summary.requests, summary.duration, created, replayed, conflicts, other, other_status,
    summary.errors.connect + summary.errors.read + summary.errors.write + summary.errors.timeout,
    latency:percentile(50), latency:percentile(99)))
end
""".replace("__TOKEN__", TOKEN)


def wrk(url: str, script: str, mode: str, duration: float, connections: int) -> dict[str, Any]:
    """One wrk run (one thread) of ``duration`` seconds: the script's summary, and the rate."""
    binary = shutil.which("wrk")
    if binary is None:
        raise SystemExit("wrk is not installed (apt-get install -y wrk, or make bench)")
    command = [
        binary, "-t1", f"-c{connections}", f"-d{int(duration)}s", "--timeout", "10s",
        "-s", script, url, "--", uuid.uuid4().hex[:12], mode, BODY,
    ]  # fmt: skip
    out = subprocess.run(
        command, capture_output=True, text=True, check=True, timeout=duration + 60
    ).stdout
    line = next((ln for ln in out.splitlines() if ln.startswith("WRKJSON ")), None)
    if line is None:
        raise RuntimeError("wrk printed no summary:\n" + out)
    result: dict[str, Any] = json.loads(line[len("WRKJSON ") :])
    result["rps"] = result["requests"] / (result["duration_us"] / 1e6)
    return result


def describe(result: dict[str, Any]) -> str:
    extra = f", {result['replayed']} replayed" if result["replayed"] else ""
    if result["conflicts"]:
        extra += f", {result['conflicts']} in progress (409)"
    if result["other"]:
        extra += f", {result['other']} other (last status {result['other_status']})"
    if result["socket_errors"]:
        extra += f", {result['socket_errors']} socket errors"
    return (
        f"{result['rps']:7.1f} req/s  p50 {result['p50_us'] / 1000:6.2f} ms  "
        f"p99 {result['p99_us'] / 1000:6.2f} ms  ({result['created']} created{extra})"
    )


def failed(mode: str, result: dict[str, Any]) -> int:
    """Requests that did not answer as the route must: 201, and in a replay run a 201
    replay after the first, or a 409 while the first is in progress."""
    bad = result["other"] + result["socket_errors"]
    if mode != "replay":
        bad += result["conflicts"] + result["replayed"]
    elif result["created"] > 1:
        bad += result["created"] - 1
    return int(bad)
