"""Live A/B with a real load generator: vLLM's OpenAI server (CPU build, tiny reasoning model,
the live demo's settings) with the stock scheduler and with MeridianScheduler, in alternating
rounds (e.g. ABBA), each a fresh server under the same open-loop aiperf load (60 streaming chat
requests `think N answer M`, seeded, at a fixed request rate). aiperf lives in its own virtual
environment (it pins its own dependencies): `uv venv /tmp/lg && uv pip install --python
/tmp/lg/bin/python aiperf`, or point AIPERF at the binary.

    .venv/bin/python bench/live_ab_aiperf.py vllm-fcfs,meridian,meridian,vllm-fcfs 6 OUT_DIR
"""
import json, os, random, subprocess, sys, time, glob
from pathlib import Path
from meridian.demo.server import VllmServer
from meridian.demo.live import BASE_ARGS, LIVE_CONFIG
MODEL = (Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "tiny-reasoner")
AIPERF = os.environ.get("AIPERF", "/tmp/lg/bin/aiperf")
CACHE = MODEL.parents[2] / ".cache"
rounds = sys.argv[1].split(",")
rate = sys.argv[2]
out = Path(sys.argv[3]) if len(sys.argv) > 3 else Path("live_ab")
out.mkdir(parents=True, exist_ok=True)
rng = random.Random(0)
(out / "prompts.jsonl").write_text("".join(
    json.dumps({"text": f"think {rng.randint(20, 99)} answer {rng.randint(5, 26)}"}) + "\n" for _ in range(60)))
results = []
for k, policy in enumerate(rounds):
    args = list(BASE_ARGS)
    if policy == "meridian":
        args += ["--scheduler-cls", "meridian.vllm.MeridianScheduler", "--additional-config", json.dumps({"meridian": LIVE_CONFIG})]
    with VllmServer(MODEL, args, log_path=out / f"serve-{k}-{policy}.log", cache_dir=CACHE) as srv:
        art = out / f"art-{k}-{policy}"
        cmd = [AIPERF, "profile", "--model", str(MODEL), "--tokenizer", str(MODEL), "--url", srv.base_url,
               "--endpoint-type", "chat", "--streaming", "--input-file", str(out / "prompts.jsonl"),
               "--custom-dataset-type", "single_turn", "--request-rate", rate, "--request-count", "60",
               "--extra-inputs", "max_tokens:200", "--extra-inputs", "temperature:0.0", "--random-seed", "0",
               "--artifact-dir", str(art), "--ui-type", "none"]
        t = time.monotonic()
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=400)
        (out / f"aiperf-{k}-{policy}.log").write_text(r.stdout + r.stderr)
        files = glob.glob(str(art / "**" / "*aiperf*.json"), recursive=True)
        print(policy, "rc", r.returncode, f"{time.monotonic()-t:.0f}s", files[:3], flush=True)
        results.append({"round": k, "policy": policy, "files": files})
json.dump(results, open(out / "rounds.json", "w"))

# ---- the table: every round, then each policy's rounds side by side (the spread) ----
rows = []
for f in sorted(glob.glob(str(out / 'art-*' / 'profile_export_aiperf.json'))):
    k, pol = Path(f).parent.name[4:].split('-', 1)
    d = json.load(open(f))
    g = lambda m, s: d[m][s] if m in d and d[m] else float('nan')
    errs = d.get('error_summary') or []
    rows.append((int(k), pol, g('time_to_first_token','p50'), g('time_to_first_token','p99'), g('time_to_first_output_token','p50'),
                 g('time_to_first_output_token','p99'), g('inter_token_latency','p99'), g('output_token_throughput','avg'), d['request_count']['avg'], len(errs)))
print("round policy     TTFT p50/p99 ms    TTFO p50/p99 ms    ITL p99 ms  out tok/s  requests errors")
for r in sorted(rows):
    print(f"{r[0]:5d} {r[1]:10s} {r[2]:7.0f}/{r[3]:7.0f}  {r[4]:7.0f}/{r[5]:7.0f}  {r[6]:9.1f}  {r[7]:9.1f}  {r[8]:6.0f}  {r[9]}")
for pol in ('vllm-fcfs','meridian'):
    sel = [r for r in rows if r[1] == pol]
    if sel:
        for i, name in ((4, 'TTFO p50'), (5, 'TTFO p99'), (7, 'tok/s')):
            v = [r[i] for r in sel]; print(pol, name, 'rounds', [round(x) for x in v])

