"""Exported launch scripts start as written: every export of every bundled problem is run, host by
host, against stub engine commands that record their command line; names that carry shell syntax
stay inert."""

import json
import shlex
import subprocess
from pathlib import Path

import pytest

from planner.errors import PlannerInputError
from planner.model.catalog import load_model_specs
from planner.output.engines import vendor_of
from planner.output.export import SPREAD_ROUTER, VLLM_ROUTER, export_plan
from planner.output.files import spread_router, vllm_pd_router
from planner.output.plan import as_plan
from planner.output.plan_report import solve_record

ENGINES = ("vllm", "sglang", "trtllm")
STUBBED = ("vllm", "python3", "trtllm-serve", "mpirun", "curl")


@pytest.fixture(scope="module")
def stubs(tmp_path_factory) -> Path:
    """Commands that append their argv to $STUB_LOG (one line per call); servers then idle until stopped."""
    directory = tmp_path_factory.mktemp("stubs")
    for name in STUBBED:  # argv joined by the unit separator, one call per line (pure bash: no interpreter start-up per call)
        body = ("#!/usr/bin/env bash\nline=$(printf '%s\\x1f' " + shlex.quote(name) + ' "$@")\n'
                'printf \'%s\\n\' "$line" >> "$STUB_LOG"\n')  # one write per call: servers start side by side
        body += "exit 0\n" if name == "curl" else "exec sleep 30\n"
        path = directory / name
        path.write_text(body)
        path.chmod(0o755)
    return directory


def _run_host(script: Path, host: str, hosts: dict[str, str], stubs: Path, work: Path) -> tuple[subprocess.CompletedProcess, list[list[str]]]:
    (work / "hosts.txt").write_text("".join(f"{name} {address}\n" for name, address in hosts.items()))
    log = work / f"calls-{len(list(work.glob('calls-*')))}.jsonl"
    env = {"PATH": f"{stubs}:/usr/bin:/bin", "STUB_LOG": str(log), "HOME": str(work)}
    run = subprocess.run(["bash", str(script), "--host", host, "--hosts", str(work / "hosts.txt"), "--run-dir", str(work / "run"), "--smoke"],
                         capture_output=True, text=True, timeout=60, env=env, cwd=work, check=False)
    calls = [line.rstrip("\x1f").split("\x1f") for line in log.read_text().splitlines()] if log.exists() else []
    return run, calls


def _servers(calls: list[list[str]]) -> list[list[str]]:
    return [c for c in calls if c[0] != "curl"]


FLAGS = {engine: json.loads((Path(__file__).parent / "engine_flags" / f"{engine}.json").read_text()) for engine in ENGINES}


def _table(call: list[str]) -> tuple[dict, list[str]]:
    """The recorded option table a stub call answers to, and the words after the command."""
    if call[0] == "vllm":
        return FLAGS["vllm"]["options"], call[3:]  # vllm serve MODEL
    if call[0] == "python3" and call[2] == "sglang.launch_server":
        return FLAGS["sglang"]["options"], call[3:]
    if call[0] == "python3" and call[2] == "sglang_router.launch_router":
        return FLAGS["sglang"]["router"]["options"], call[3:]
    if call[0] == "mpirun":
        call = call[call.index("trtllm-llmapi-launch"):]
    if call[0] in ("trtllm-serve", "trtllm-llmapi-launch"):
        words = call[call.index("trtllm-serve") + 1:] if "trtllm-serve" in call else call[1:]
        return (FLAGS["trtllm"]["options"], words[1:]) if words[0] != "disaggregated" else ({"-c": {"takes_value": True}}, words[1:])
    if call[0] == "python3" and call[1] == VLLM_ROUTER:  # our own routers: their parsers take every word
        vllm_pd_router.parser().parse_args(call[2:])
    if call[0] == "python3" and call[1] == SPREAD_ROUTER:
        spread_router.parser().parse_args(call[2:])
    return {}, []


def _check_flags(call: list[str]) -> None:
    """Every option exists in the recorded parser, is not deprecated, and its value is one of its choices."""
    table, words = _table(call)
    if not table:
        return
    i = 0
    while i < len(words):
        flag = words[i]
        assert flag in table, f"{flag} is not an option of {call[:3]} (recorded tables)"
        entry = table[flag]
        assert not entry.get("deprecated"), f"{flag} is deprecated"
        if entry["takes_value"]:
            if entry.get("choices"):
                assert words[i + 1] in [str(c) for c in entry["choices"]], (flag, words[i + 1], entry["choices"])
            i += 1
            while i + 1 < len(words) and not words[i + 1].startswith("-"):  # further values (nargs '+', e.g. --prefill URL PORT)
                i += 1
        i += 1


def _check_semantics(call: list[str]) -> None:
    """Rules the option tables cannot express, each one an error today's exporter made."""
    words = call[call.index("trtllm-llmapi-launch") + 1:] if "trtllm-llmapi-launch" in call else call
    serves = words[0] in ("vllm", "trtllm-serve") and "disaggregated" not in words or words[:3] == ["python3", "-m", "sglang.launch_server"]
    if serves and "--headless" not in words:  # every serving process binds an address other hosts reach
        assert words[words.index("--host") + 1] == "0.0.0.0", words
    if words[0] == "vllm":
        assert "--quantization" not in words or words[words.index("--quantization") + 1] != "fp8"  # deprecated for bf16 checkpoints
        value = {flag: int(words[words.index(flag) + 1]) for flag in ("--data-parallel-size", "--data-parallel-size-local") if flag in words}
        if value.get("--data-parallel-size-local", value.get("--data-parallel-size", 1)) < value.get("--data-parallel-size", 1):
            assert "--data-parallel-address" in words  # ranks on other hosts; the default address is 127.0.0.1
    if "--nnodes" in words and int(words[words.index("--nnodes") + 1]) > 1:  # every node finds the first one
        assert "--dist-init-addr" in words or "--master-addr" in words
        assert "--distributed-executor-backend" not in words  # Ray is not installed with vLLM
    model = words[3] if words[0] == "vllm" else words[1] if words[0] == "trtllm-serve" else (
        words[words.index("--model-path") + 1] if "--model-path" in words else "")
    assert not model.startswith("meta-llama/Meta-Llama-3.1-")  # base models were served for chat workloads
    if "Kimi-K2" in model:
        assert {"--trust-remote-code", "--trust_remote_code"} & set(words)


def _stages_split_over_hosts(record: dict) -> bool:
    """Whether some host holds part of a data-parallel rank's pipeline stages (a layout vLLM, which keeps a
    rank's whole TP x PP group on one host, cannot start as planned)."""
    for d in record["deployments"]:
        per_host_rank: dict[tuple, set] = {}
        for role in d["placement"]:
            rack, slot = role["accelerator"].rsplit("/", 1)
            per_host_rank.setdefault((role["replica"], rack, int(slot) // record["racks"][rack]["accelerators_per_host"], role["dp_rank"]),
                                     set()).add(role["stage"])
        if d["dp_attn"] > 1 and any(len(stages) < d["pp"] for stages in per_host_rank.values()):
            return True
    return False


def test_vllm_refuses_the_kimi_layout_and_sglang_starts_its_stages_where_planned(solved_bundled, tmp_path):
    """kimi-k2-hgx-h100: stage 0 of all 8 data-parallel ranks on host 0, stage 1 on host 1 (issue 24). vLLM
    would run both stages of 4 ranks on each host, so it is refused (exit 2 from the CLI) naming SGLang,
    whose node n runs pipeline rank n // (nnodes / pp_size) (sglang entrypoints/engine.py)."""
    from planner.cli.main import main

    record = solve_record(solved_bundled["kimi-k2-hgx-h100"][1])
    d = record["deployments"][0]
    assert d["pp"] == 2 and d["dp_attn"] > 1 and _stages_split_over_hosts(record)
    for fmt in (["--format", "vllm"], ["--format", "lws", "--engine", "vllm"]):
        plan = tmp_path / "plan.json"
        plan.write_text(json.dumps(record))
        assert main(["export", str(plan), *fmt, "-o", str(tmp_path / "out")]) == 2 and not (tmp_path / "out").exists()
    script = tmp_path / "launch.sh"
    script.write_text(export_plan(record, "sglang"))
    hosts = subprocess.run(["bash", str(script), "--list-hosts"], capture_output=True, text=True, check=True).stdout.split()
    text = script.read_text()
    for host in hosts[:2]:  # the host's start command as the script runs it (a worker host serves no port, so a smoke run may stop it unlogged)
        block = text[text.index(f"    {shlex.quote(host)})"):]
        call = shlex.split(block[:block.index(";;")].replace("\\\n", " "))
        value = {flag: int(call[call.index(flag) + 1]) for flag in ("--pp-size", "--nnodes", "--node-rank")}
        pp_rank = value["--node-rank"] // max(value["--nnodes"] // value["--pp-size"], 1)
        rack, index = host.rsplit("/host", 1)
        planned = {r["stage"] for r in d["placement"] if r["replica"] == 0 and r["accelerator"].startswith(rack + "/")
                   and int(r["accelerator"].rsplit("/", 1)[1]) // record["racks"][rack]["accelerators_per_host"] == int(index)}
        assert planned == {pp_rank}, (host, planned, value)


@pytest.mark.parametrize("engine", ENGINES)
def test_every_bundled_export_starts_on_every_host(solved_bundled, stubs, tmp_path, engine):
    started = 0
    for name, (_, result) in solved_bundled.items():
        record = solve_record(result)
        vendors = {vendor_of(as_plan(record), d["accelerator"]) for d in record["deployments"]}
        if not vendors <= ({"NVIDIA"} if engine == "trtllm" else {"NVIDIA", "AMD"}):
            with pytest.raises(PlannerInputError):  # TensorRT-LLM off NVIDIA, or TPU / Trainium: refused by name
                export_plan(record, engine)
            continue
        if engine == "vllm" and _stages_split_over_hosts(record):
            with pytest.raises(PlannerInputError, match="export --format sglang"):  # vLLM cannot hold the layout: refused by name
                export_plan(record, engine)
            continue
        text = export_plan(record, engine)
        script = tmp_path / f"{name}-{engine}.sh"
        script.write_text(text)
        assert subprocess.run(["bash", "-n", str(script)], capture_output=True, check=False).returncode == 0, name
        hosts = subprocess.run(["bash", str(script), "--list-hosts"], capture_output=True, text=True, check=True).stdout.split()
        addresses = {h: f"10.0.{i // 250}.{i % 250 + 1}" for i, h in enumerate(hosts)}
        for host in hosts[:3] + hosts[-1:]:
            run, calls = _run_host(script, host, addresses, stubs, tmp_path)
            assert run.returncode == 0, (name, engine, host, run.stderr[-2000:])
            servers = _servers(calls)
            started += len(servers)
            bootstrap = [c[c.index("--disaggregation-bootstrap-port") + 1] for c in servers if "--disaggregation-bootstrap-port" in c]
            assert len(bootstrap) == len(set(bootstrap)), (name, host, bootstrap)  # 8 prefill servers all took 8998
            for call in servers:
                _check_flags(call)
                _check_semantics(call)
                if call[0] == "python3" and call[1] != "-m":  # a script the export ships: written into the run directory
                    assert (tmp_path / "run" / call[1]).is_file(), (name, call[:2])
                if call[0] == "vllm" and "--data-parallel-size-local" in call:  # vLLM ParallelConfig's rule
                    assert int(call[call.index("--data-parallel-size-local") + 1]) <= int(call[call.index("--data-parallel-size") + 1])
            text_calls = " ".join(" ".join(c) for c in servers)
            assert "<" not in text_calls and "127.0.0.1" not in text_calls  # no placeholders, no loopback-only servers
            ports = [c[c.index(flag) + 1] for c in servers for flag in ("--port",) if flag in c]
            assert len(ports) == len(set(ports)), (name, engine, host, ports)  # unique on the host
            for other in set(addresses) - {host}:  # addresses of other hosts come from the hosts file
                assert other not in text_calls
        if engine == "trtllm":  # the engine YAML validates with extra="forbid": every key must be a recorded LlmArgs field
            import yaml

            known = set(FLAGS["trtllm"]["extra_llm_api_options"])
            for options in (tmp_path / "run").glob("extra_llm_api_options_*.yaml"):
                for key, value in yaml.safe_load(options.read_text()).items():
                    names = [f"{key}.{sub}" for sub in value] if isinstance(value, dict) else [key]
                    assert set(names) <= known, (name, names)
    assert started > 0


def test_a_missing_host_address_stops_before_anything_starts(solved_bundled, stubs, tmp_path):
    record = solve_record(solved_bundled["deepseek-v3-gb200-nvl72"][1])
    script = tmp_path / "launch.sh"
    script.write_text(export_plan(record, "sglang"))
    hosts = subprocess.run(["bash", str(script), "--list-hosts"], capture_output=True, text=True, check=True).stdout.split()
    run, calls = _run_host(script, hosts[0], {hosts[0]: "10.0.0.1"}, stubs, tmp_path)
    if len(hosts) > 1:
        assert run.returncode == 2 and "no address for" in run.stderr and calls == []
    run, calls = _run_host(script, hosts[0], {h: "10.0.0.1;touch PWNED" for h in hosts}, stubs, tmp_path)
    assert run.returncode == 2 and "not a host name or IP address" in run.stderr and calls == []


@pytest.mark.parametrize("name", ["chat$(touch PWNED)", "a;touch PWNED", "a`touch PWNED`", "x' ; touch PWNED ; '", "../../etc/x"])
@pytest.mark.parametrize("engine", ENGINES)
def test_a_hostile_workload_name_stays_inert(solved_bundled, stubs, tmp_path, name, engine):
    record = json.loads(json.dumps(solve_record(solved_bundled["disaggregation-wins-long-prompts"][1])))
    old = record["deployments"][0]["workload"]
    for d in record["deployments"]:
        d["workload"] = name if d["workload"] == old else d["workload"]
    for w in record["problem_spec"]["workloads"]:
        w["name"] = name if w["name"] == old else w["name"]
    record["problem"] = name
    script = tmp_path / "launch.sh"
    script.write_text(export_plan(record, engine))
    hosts = subprocess.run(["bash", str(script), "--list-hosts"], capture_output=True, text=True, check=True).stdout.split()
    for host in hosts[:2]:
        run, _ = _run_host(script, host, {h: "10.0.0.1" for h in hosts}, stubs, tmp_path)
        assert run.returncode == 0, run.stderr[-2000:]
    assert not list(tmp_path.rglob("PWNED")) and not (tmp_path.parent / "etc").exists()
    assert all("/" not in p.name for p in (tmp_path / "run").iterdir())


def test_tensorrt_llm_is_refused_on_amd(solved_bundled):
    record = json.loads(json.dumps(solve_record(solved_bundled["llama-3.1-70b-hgx-h100"][1])))
    for d in record["deployments"]:
        d["accelerator"] = "mi300x"
    with pytest.raises(PlannerInputError, match="NVIDIA GPUs only"):
        export_plan(record, "trtllm")


def test_quantizing_at_load_time_is_flagged_where_the_weights_do_not_fit(solved_bundled, monkeypatch):
    # fp8-planned Llama servers pointed at bf16 checkpoints: 141 GB of weights on an 80 GB H100.
    from planner.model import catalog
    from planner.output import checkpoints

    specs = {k: v.model_copy(update={"quantized_repos": {}}) for k, v in catalog.load_model_specs().items()}
    monkeypatch.setattr(checkpoints, "load_model_specs", lambda: specs)
    record = solve_record(solved_bundled["disaggregation-wins-long-prompts"][1])
    prefill = next(i for i, d in enumerate(record["deployments"]) if d["role"] == "prefill" and d["tp"] == 1)
    vllm = export_plan(record, "vllm")
    assert f"NOTE: deployment {prefill}: vllm loads meta-llama/Llama-3.1-70B-Instruct in bf16 before quantizing" in vllm
    assert "--quantization fp8_per_tensor" in vllm
    sglang = export_plan(record, "sglang")
    assert "--load-format layered" in sglang and "loads meta-llama" not in sglang  # layer by layer: no bf16 copy in HBM
    assert "does not quantize at load time" in export_plan(record, "trtllm")


def _strict(schema):
    """The CRD schema with unknown fields refused, as `kubectl apply --validate=strict` does."""
    if isinstance(schema, dict):
        schema = {k: _strict(v) for k, v in schema.items()}
        if schema.get("type") == "object" and "properties" in schema and "additionalProperties" not in schema \
                and not schema.get("x-kubernetes-preserve-unknown-fields"):
            schema["additionalProperties"] = False
    elif isinstance(schema, list):
        schema = [_strict(v) for v in schema]
    return schema


@pytest.fixture(scope="module")
def lws_validator():
    import gzip

    import jsonschema

    with gzip.open(Path(__file__).parent / "k8s" / "leaderworkerset-v0.10.0.schema.json.gz") as stream:
        stored = json.loads(stream.read())
    return jsonschema.Draft7Validator(_strict(stored["openAPIV3Schema"]))


def _check_files_shipped(pod: dict, configmap: dict) -> None:
    """Every file a container's command names (a word ending in a file suffix) is in the ConfigMap mounted
    as its working directory: a script or config the image does not hold must travel with the manifest."""
    import re
    import shlex

    mounts = {v["name"]: v["configMap"]["name"] for v in pod["volumes"] if "configMap" in v}
    for container in pod["containers"]:
        files = {m["mountPath"]: set(configmap["data"]) for m in container["volumeMounts"]
                 if mounts.get(m["name"]) == configmap["metadata"]["name"]}
        assert container["workingDir"] in files
        for w in shlex.split(container["command"][2]):
            if re.fullmatch(r"[\w./-]+\.(py|yaml|yml|json|sh)", w):
                directory, _, base = (w if w.startswith("/") else f"{container['workingDir']}/{w}").rpartition("/")
                assert base in files.get(directory, set()), (w, container["name"], sorted(files.get(directory, set())))


@pytest.mark.parametrize("engine", ENGINES)
def test_leaderworkerset_manifests_match_the_crd(solved_bundled, lws_validator, engine):
    import yaml

    checked = 0
    for name, (_, result) in solved_bundled.items():
        record = solve_record(result)
        try:
            text = export_plan(record, "lws", engine=engine)
        except PlannerInputError as exc:  # stated refusals only: engines off their hardware, mpirun between pods, vLLM's rank order
            assert "only" in str(exc) or "mpirun" in str(exc) or "no " in str(exc), (name, exc)
            assert "pipeline stages" not in str(exc) or (engine == "vllm" and _stages_split_over_hosts(record))
            continue
        docs = list(yaml.safe_load_all(text))
        assert docs[0]["kind"] == "ConfigMap" and all(len(k) <= 253 for k in docs[0]["data"])
        _check_names(docs)
        for doc in (d for d in docs[1:] if d["kind"] == "LeaderWorkerSet"):
            errors = sorted(lws_validator.iter_errors(doc), key=str)
            assert not errors, (name, engine, [e.message for e in errors[:3]])
            template = doc["spec"]["leaderWorkerTemplate"]
            for pod in (template["workerTemplate"], template.get("leaderTemplate", template["workerTemplate"])):
                command = pod["spec"]["containers"][0]["command"][2]
                assert "<" not in command and "127.0.0.1" not in command and "_VISIBLE_DEVICES" not in command
                _check_files_shipped(pod["spec"], docs[0])
                _check_pod(pod["spec"], engine)
            checked += 1
        servers = [d for d in docs[1:] if d["kind"] == "LeaderWorkerSet" and d["metadata"]["labels"]["app.kubernetes.io/component"] == "server"]
        assert sum(d["spec"]["replicas"] for d in servers) == sum(d["replicas"] for d in record["deployments"])  # a group per replica
        _check_imex(record, docs, servers)
        _check_services(record, docs)
    assert checked > 0


_MODEL_OF_REPO = {repo: k for k, spec in load_model_specs().items()
                  for repo in (spec.hf_repo, spec.serving_repo, *spec.quantized_repos.values()) if repo}


def _check_pod(pod: dict, engine: str) -> None:
    """What a serving pod needs beyond its command (issue 24's warnings)."""
    import shlex

    main = pod["containers"][0]
    tag = main["image"].rsplit(":", 1)[1]
    assert tag != "latest"
    if engine != "trtllm":  # the release whose parser the flags were recorded from
        assert tag.startswith(f"v{FLAGS[engine]['version']}"), (main["image"], FLAGS[engine]["version"])
    gpus = max(main.get("resources", {}).get("limits", {}).values(), default=0)
    if gpus:  # /dev/shm: SGLang's install guide runs its image on an 8-GPU host with --shm-size 32g, so 4 GiB per GPU
        shm = next(v for v in pod["volumes"] if v["name"] == next(m["name"] for m in main["volumeMounts"] if m["mountPath"] == "/dev/shm"))
        assert shm["emptyDir"] == {"medium": "Memory", "sizeLimit": f"{32 * gpus // 8}Gi"}
    words = shlex.split(main["command"][2])
    repo = words[words.index("serve") + 1] if "serve" in words else words[words.index("--model-path") + 1] if "--model-path" in words else \
        words[words.index("trtllm-serve") + 1] if "trtllm-serve" in words else None
    if repo and repo != "disaggregated" and not repo.startswith("/"):  # a Hugging Face download: the token from a named secret, required where the repo is gated
        token = next(e for e in main["env"] if e["name"] == "HF_TOKEN")["valueFrom"]["secretKeyRef"]
        # gated on Hugging Face: the Llama licence (meta-llama/...) and the Falcon-180B TII licence, for every repository of those models
        assert token["name"] and token["optional"] is (not _MODEL_OF_REPO[repo].startswith(("llama-", "falcon-"))), (repo, token)
    if "ports" in main:
        port = main["ports"][0]["containerPort"]
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            assert main[probe]["httpGet"]["port"] == port and main[probe]["httpGet"]["path"].startswith("/health")


def _check_imex(record: dict, docs: list[dict], servers: list[dict]) -> None:
    """On a rack whose NVLink domain spans several hosts, every pod of a multi-host group claims a channel
    from a ComputeDomain of the NVIDIA DRA driver (resource.nvidia.com/v1beta1); elsewhere none does."""
    domains = {d["spec"]["channel"]["resourceClaimTemplate"]["name"]: d for d in docs if d["kind"] == "ComputeDomain"}
    assert all(d["apiVersion"] == "resource.nvidia.com/v1beta1" for d in domains.values())
    for d, lws in zip(record["deployments"], servers):
        rack = record["racks"][d["placement"][0]["accelerator"].rsplit("/", 1)[0]]
        hosts = d["accelerators_per_replica"] / rack["accelerators_per_host"]
        wanted = hosts > 1 and rack["accelerators"] > rack["accelerators_per_host"] and vendor_of(as_plan(record), d["accelerator"]) == "NVIDIA"
        template = lws["spec"]["leaderWorkerTemplate"]
        for pod in (template["workerTemplate"], template.get("leaderTemplate", template["workerTemplate"])):
            claims = pod["spec"].get("resourceClaims", [])
            assert bool(claims) == wanted, (d["rack"], hosts)
            for claim in claims:
                assert claim["resourceClaimTemplateName"] in domains
                assert {"name": claim["name"]} in pod["spec"]["containers"][0]["resources"]["claims"]


def _check_services(record: dict, docs: list[dict]) -> None:
    """A Service per workload, selecting the pods that answer it: leaders (worker index 0) that serve HTTP."""
    services = [d for d in docs if d["kind"] == "Service"]
    assert len(services) == len({d["workload"] for d in record["deployments"]})
    for service in services:
        selector = dict(service["spec"]["selector"])
        assert selector.pop("leaderworkerset.sigs.k8s.io/worker-index") == "0"
        matched = []
        for lws in (d for d in docs if d["kind"] == "LeaderWorkerSet"):
            template = lws["spec"]["leaderWorkerTemplate"]
            leader = template.get("leaderTemplate", template["workerTemplate"])
            if selector.items() <= leader.get("metadata", {}).get("labels", {}).items():
                matched.append(lws)
                assert leader["spec"]["containers"][0]["ports"][0]["name"] == service["spec"]["ports"][0]["targetPort"]
        assert matched, service["metadata"]["name"]


def test_a_kubernetes_router_reaches_every_group_at_its_template_port(solved_bundled):
    # Groups of one LeaderWorkerSet share the first replica's command (and ports); each has its own leader DNS name.
    import re

    import yaml

    record = solve_record(solved_bundled["disaggregation-wins-long-prompts"][1])
    docs = list(yaml.safe_load_all(export_plan(record, "lws", engine="sglang")))
    lws = [d for d in docs[1:] if d["kind"] == "LeaderWorkerSet"]
    servers = {d["metadata"]["name"]: d for d in lws if d["metadata"]["labels"]["app.kubernetes.io/component"] == "server"}
    router = next(d for d in lws if d["metadata"]["labels"]["app.kubernetes.io/component"] == "router")
    command = router["spec"]["leaderWorkerTemplate"]["workerTemplate"]["spec"]["containers"][0]["command"][2]
    prefill = re.findall(r"--prefill http://([a-z0-9-]+)-(\d+)\.([a-z0-9-]+):(\d+) (\d+)", command)
    n_prefill = sum(d["replicas"] for d in record["deployments"] if d["role"] == "prefill")
    assert len(prefill) == n_prefill and len({(name, group) for name, group, *_ in prefill}) == n_prefill
    for name, group, service, port, _ in prefill:
        lws = servers[name]
        assert service == name and int(group) < lws["spec"]["replicas"]
        container = lws["spec"]["leaderWorkerTemplate"]["workerTemplate"]["spec"]["containers"][0]
        assert container["ports"][0]["containerPort"] == int(port)


def _mtp_record(solved_bundled, serving: str) -> dict:
    """The bundled DeepSeek-R1 MTP plan, or the same problem served by prefill and decode pools."""
    if serving == "aggregated":
        return solve_record(solved_bundled["fast-mode-deepseek-r1-mtp"][1])
    from planner.paths import data_dir
    from planner.problem.resolve import resolve_problem
    from planner.problem.schema import load_problem
    from planner.solver.solve import solve

    problem = load_problem(data_dir("problems") / "fast-mode-deepseek-r1-mtp.yaml")
    from planner.modes import ServingMode

    workload = problem.workloads[0].model_copy(update={"serving": ServingMode(serving), "speculative": problem.workloads[0].speculative.model_copy(
        update={"draft_tokens": 2})})
    return solve_record(solve(resolve_problem(problem.model_copy(update={"workloads": [workload]}))))


@pytest.mark.parametrize("serving", ["aggregated", "disaggregated"])
@pytest.mark.parametrize("engine", ENGINES)
def test_speculative_decoding_reaches_every_server_with_the_engines_own_flags(solved_bundled, stubs, tmp_path, engine, serving):
    """MTP draft tokens as each engine's parser takes them (checked against the recorded tables); a prefill
    server runs the same draft settings as its decode side."""
    import yaml

    record = _mtp_record(solved_bundled, serving)
    k = max(d["speculative"]["draft_tokens"] for d in record["deployments"] if d["role"] != "prefill")
    assert k > 0 and all(d["speculative"] for d in record["deployments"])
    script = tmp_path / "launch.sh"
    script.write_text(export_plan(record, engine))
    hosts = subprocess.run(["bash", str(script), "--list-hosts"], capture_output=True, text=True, check=True).stdout.split()
    servers = []
    for host in hosts:
        for _ in range(5):  # a smoke run may stop a stub server before it has logged its command line: run the host again
            run, calls = _run_host(script, host, {h: "10.0.0.1" for h in hosts}, stubs, tmp_path)
            assert run.returncode == 0, run.stderr[-2000:]
            mine = [c for c in _servers(calls) if _table(c)[0] is FLAGS[engine]["options"]]  # engine servers, not routers
            if mine:
                break
        servers += mine
    assert servers
    for call in servers:
        _check_flags(call)
        if engine == "vllm":
            config = json.loads(call[call.index("--speculative-config") + 1])
            assert config == {"method": "mtp", "num_speculative_tokens": k}
            assert config["method"] in FLAGS["vllm"]["options"]["--spec-method"]["choices"]  # the parser's method names
        elif engine == "sglang":
            value = {flag: call[call.index(flag) + 1] for flag in ("--speculative-algorithm", "--speculative-num-steps",
                                                                    "--speculative-eagle-topk", "--speculative-num-draft-tokens")}
            assert value == {"--speculative-algorithm": "EAGLE", "--speculative-num-steps": str(k), "--speculative-eagle-topk": "1",
                             "--speculative-num-draft-tokens": str(k + 1)}
    if engine == "trtllm":
        known = FLAGS["trtllm"]["extra_llm_api_options"]
        options = [yaml.safe_load(p.read_text()) for p in (tmp_path / "run").glob("extra_llm_api_options_*.yaml")]
        assert options and all(o["speculative_config"] == {"decoding_type": "MTP", "max_draft_len": k} for o in options)
        assert "MTP" in known["speculative_config.decoding_type"]["allowed"]
    assert f"speculative decoding with {k} MTP draft tokens" in script.read_text()  # the assumed acceptance, as a NOTE


DNS_1035 = r"[a-z]([-a-z0-9]*[a-z0-9])?"
# A LeaderWorkerSet's name is its headless Service's (a DNS-1035 label); group g runs as StatefulSet `<name>-<g>`,
# whose pods carry the label `controller-revision-hash: <statefulset>-<10 characters>` (a label value: at most 63),
# so `<name>-<g>` has at most 52 characters for every group up to 999999 (the webhook's replica limit).
LWS_NAME_MAX = 52 - len("-999999")


def _check_names(docs: list[dict]) -> None:
    """Every object's name a DNS-1035 label within the controller's limits, unique among its kind; a
    LeaderWorkerSet's name is also a Service's (its headless one), so Services and LeaderWorkerSets share one space."""
    import re

    seen: dict[str, set[str]] = {}
    for doc in docs:
        name, kind = doc["metadata"]["name"], doc["kind"]
        assert re.fullmatch(DNS_1035, name) and len(name) <= 63, name
        if kind == "LeaderWorkerSet":
            assert len(name) <= LWS_NAME_MAX, name
        space = "Service" if kind in ("Service", "LeaderWorkerSet") else kind
        assert name not in seen.setdefault(space, set()), (kind, name)
        seen[space].add(name)


@pytest.mark.parametrize("problem", ["mixed-fleet-three-models on gb200-nvl72 + hgx-h100",  # the issue's: 6 groups shared one name
                                     "mixed-fleet-three-models-on-gb200-nvl72-hgx-h100", "q" * 63, "7" + "-" * 62, "x"])
@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_every_kubernetes_object_has_its_own_valid_name(solved_bundled, problem, engine):
    import yaml

    for bundled in ("mixed-fleet-three-models", "disaggregation-wins-long-prompts"):
        record = json.loads(json.dumps(solve_record(solved_bundled[bundled][1])))
        record["problem"] = problem
        docs = list(yaml.safe_load_all(export_plan(record, "lws", engine=engine)))
        lws = [d for d in docs if d["kind"] == "LeaderWorkerSet"]
        assert len(lws) >= len(record["deployments"])
        _check_names(docs)


def _engine_call(words: list[str]) -> list[str]:
    """The words an engine command receives, as the stubs record them: after `exec` and `env VAR=value ...`."""
    words = words[1:] if words[:1] == ["exec"] else words
    if words[:1] == ["env"]:
        words = words[1:]
        while words and "=" in words[0] and not words[0].startswith("-"):
            words = words[1:]
    return words


@pytest.mark.parametrize("engine", ENGINES)
def test_every_command_of_every_host_and_pod_passes_the_recorded_tables(solved_bundled, engine):
    """Issue 24's done-when, for every host (the stub runs above take four per plan) and every pod: each engine
    and router command of every bundled export against the recorded parser tables and the semantic rules."""
    import shlex

    import yaml

    from planner.output.export import build_launch
    from planner.output.launch import HostRef, RankRef

    checked = 0
    for _, result in solved_bundled.values():
        record = solve_record(result)
        try:
            script = build_launch(as_plan(record), engine)
        except PlannerInputError:  # refusals by name: tested above
            continue
        hosts = {h: f"10.1.{i // 250}.{i % 250 + 1}" for i, h in enumerate(script.hosts)}
        for server in script.servers:
            words = ["".join(hosts[p.host] if isinstance(p, HostRef) else str(p.value) if isinstance(p, RankRef) else p for p in w)
                     for w in server.argv]
            call = _engine_call(words)
            _check_flags(call)
            _check_semantics(call)
            checked += 1
        try:
            manifests = export_plan(record, "lws", engine=engine)
        except PlannerInputError:
            continue
        for doc in yaml.safe_load_all(manifests):
            if doc["kind"] == "LeaderWorkerSet":
                template = doc["spec"]["leaderWorkerTemplate"]
                for pod in (template["workerTemplate"], template.get("leaderTemplate", template["workerTemplate"])):
                    call = _engine_call(shlex.split(pod["spec"]["containers"][0]["command"][2]))
                    _check_flags(call)
                    _check_semantics(call)
                    checked += 1
    assert checked > 0


def test_a_generated_problem_with_a_63_character_name_exports_distinct_valid_names(tmp_path):
    """Issue 24's done-when: a problem solved from a file whose name has 63 characters, with two 64-character
    workload names that differ only at their end (one disaggregated, so routers and more objects)."""
    import yaml

    from planner.problem.resolve import resolve_problem
    from planner.problem.schema import parse_problem
    from planner.solver.solve import solve

    stem = "w" * 60
    problem = {"name": "Plan_" + "n" * 58, "model": "llama-3.1-8b", "cluster": {"racks": [{"type": "hgx-h100", "count": 4}]},
               "workloads": [{"name": f"{stem}-agg", "input_tokens": 1024, "output_tokens": 128, "tpot_limit_ms": 50,
                              "demand": {"output_tokens_per_s": 20000}},
                             {"name": f"{stem}-pd1", "input_tokens": 8192, "output_tokens": 128, "tpot_limit_ms": 50, "ttft_limit_ms": 5000,
                              "demand": {"output_tokens_per_s": 3000}, "serving": "disaggregated"}]}
    assert len(problem["name"]) == 63 and all(len(w["name"]) == 64 for w in problem["workloads"])
    record = solve_record(solve(resolve_problem(parse_problem(problem), base_dir=tmp_path)))
    assert record["problem"] == problem["name"] and {d.get("role", "aggregated") for d in record["deployments"]} >= {"aggregated", "prefill"}
    for engine in ("vllm", "sglang"):
        docs = list(yaml.safe_load_all(export_plan(record, "lws", engine=engine)))
        _check_names(docs)
        assert len([d for d in docs if d["kind"] == "Service"]) == 2  # one per workload: their names did not collide


def test_the_vllm_router_hands_the_prefill_servers_kv_to_a_decode_server():
    """The shipped router run against two stub vLLM servers: the prefill side gets one output token and
    do_remote_decode, the decode side the kv_transfer_params the prefill side answered with, and the
    client the decode side's answer (streamed too)."""
    from fastapi import FastAPI, Request
    from fastapi.responses import StreamingResponse
    from fastapi.testclient import TestClient

    seen: dict[str, list[dict]] = {"prefill": [], "decode": []}
    prefill, decode = FastAPI(), FastAPI()

    @prefill.post("/v1/completions")
    async def prefill_completion(request: Request) -> dict:
        seen["prefill"].append(await request.json())
        return {"choices": [{"text": "x"}], "kv_transfer_params": {"remote_engine_id": "p0", "remote_block_ids": [3, 4]}}

    @decode.post("/v1/completions")
    async def decode_completion(request: Request):
        body = await request.json()
        seen["decode"].append(body)
        if body.get("stream"):
            return StreamingResponse(iter([b"data: a\n\n", b"data: [DONE]\n\n"]), media_type="text/event-stream")
        return {"choices": [{"text": "the answer"}]}

    import httpx

    app = vllm_pd_router.make_app(["http://prefill"], ["http://decode"])
    routes = {"prefill": httpx.ASGITransport(app=prefill), "decode": httpx.ASGITransport(app=decode)}

    class ByHost(httpx.AsyncBaseTransport):
        async def handle_async_request(self, request):
            return await routes[request.url.host].handle_async_request(request)

    app.state.client = httpx.AsyncClient(transport=ByHost())  # the router's servers are the stub apps
    with TestClient(app) as client:
        answer = client.post("/v1/completions", json={"model": "m", "prompt": "hi", "max_tokens": 50})
        assert answer.status_code == 200 and answer.json()["choices"][0]["text"] == "the answer"
        streamed = client.post("/v1/completions", json={"model": "m", "prompt": "hi", "max_tokens": 50, "stream": True})
        assert streamed.text == "data: a\n\ndata: [DONE]\n\n"
        assert client.get("/healthcheck").status_code == 200
    first, second = seen["prefill"][0], seen["decode"][0]
    assert first["max_tokens"] == 1 and first["stream"] is False and first["kv_transfer_params"]["do_remote_decode"] is True
    assert second["max_tokens"] == 50 and second["kv_transfer_params"] == {"remote_engine_id": "p0", "remote_block_ids": [3, 4]}
    assert seen["decode"][1]["stream"] is True


@pytest.mark.parametrize("fmt", ["vllm", "sglang", "lws"])
def test_an_export_for_another_engine_says_what_the_planner_gives_for_it(solved_bundled, fmt):
    """llama-3.1-70b-hgx-h100 is solved with TensorRT-LLM's kernel rates; a vLLM or SGLang export says so in a
    NOTE, with the figures the public evaluate() gives for the same replica on that engine's rates."""
    import re

    from planner.quick import evaluate

    record = solve_record(solved_bundled["llama-3.1-70b-hgx-h100"][1])
    engine = "vllm" if fmt == "lws" else fmt
    assert record["problem_spec"]["engine"] == "trtllm"
    text = export_plan(record, fmt, engine=engine) if fmt == "lws" else export_plan(record, fmt)
    d, w = record["deployments"][0], record["problem_spec"]["workloads"][0]
    mine = evaluate(d["model"], d["rack"], d["batch_per_replica"], w["input_tokens"], w["output_tokens"], tp=d["tp"], pp=d["pp"],
                    weights=d["precisions"]["weights"], kv_cache=d["precisions"]["kv_cache"], compute=d["precisions"]["compute"],
                    overlap=record["problem_spec"]["solver"]["overlap"], engine=engine)
    note = re.search(rf"NOTE: deployment 0 was sized with trtllm's measured kernel rates \(TPOT ([\d.]+) ms, TTFT ([\d.]+) ms\); "
                     rf"with {engine}'s the planner gives TPOT ([\d.]+) ms, TTFT ([\d.]+) ms", text)
    assert note, text[:3000]
    assert float(note[1]) == pytest.approx(d["tpot_s"] * 1000, rel=1e-3)
    assert float(note[3]) == pytest.approx(mine.tpot_s * 1000, rel=1e-3) and float(note[4]) == pytest.approx(mine.ttft_s * 1000, rel=1e-3)
    assert mine.tpot_s != pytest.approx(d["tpot_s"], rel=1e-3)  # the engines' rates differ: the note says something
    assert "sized with" not in export_plan(record, "trtllm")  # the plan's own engine: no note
