"""The spec-level decision grows linearly with the node, in work (Python lines executed in
``hook``, counted, not timed): ``decide_spec`` for the slice pod on 254 GPUs against the same on 8,
holding one GPU or every other one.

Work ``a + b*n`` with ``a >= 0`` grows by at most ``n``'s ratio, so the whole decision may grow by
no more than the ratio of device nodes (260 / 14), and no one module by more than the ratio of GPUs
(254 / 8; a module's own fixed cost can be near zero, so its bound is the larger one). A step that
scans every rule per rule (``specwriter``'s old ``_last_touching``) or per probe (``allowlist.
access_of`` over every rule) grows as ``n*n``: the old fold made the whole 29x, its spec writer
alone 565x; the report's ``evaluate`` per kept node and the ID lookup per token (every other GPU)
made ``core/rules.py`` 137x and ``sources/nvidia/ids.py`` 132x.
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path
from types import FrameType
from typing import Any

import pytest

from bench import bundles as bench_bundles
from bench import hosts
from hook.routes.gather import host_devices
from hook.routes.precreate import Facts, decide_spec
from hook.sources import settingsfile
from tests import hosttree
from tests.bundles import settings_file

HOOK = str(Path(__file__).resolve().parent.parent / "hook")
SMALL, BIG = 8, hosts.MAX_REGULAR_MINOR + 1  # 254: every regular minor of one major (see bench/hosts.py)


def lines_run(run: Any) -> Counter[str]:
    """Lines of ``hook`` code ``run()`` executes, by module file: every loop turn counts, calls or not."""
    count: Counter[str] = Counter()

    def local(frame: FrameType, event: str, arg: object) -> Any:
        if event == "line":
            count[frame.f_code.co_filename] += 1
        return local

    def calls(frame: FrameType, event: str, arg: object) -> Any:
        return local if frame.f_code.co_filename.startswith(HOOK) else None

    before = sys.gettrace()  # a coverage tracer, say: handed back untouched
    sys.settrace(calls)
    try:
        run()
    finally:
        sys.settrace(before)
    return count


def _node(tmp: Path, gpus: int, every: int) -> tuple[Counter[str], int]:
    """(lines of one warm-cache ``decide_spec``, device nodes of the host) for the slice pod,
    allocated GPU 1 (``every`` 0) or every ``every``-th GPU by UUID."""
    spec = hosttree.HostSpec(name=f"growth-{gpus}", gpus=hosts.spec("254-gpus").gpus[:gpus])
    hosttree.TOPOLOGIES[spec.name] = spec
    try:
        hosttree.make_host_tree(tmp / "root", spec.name, mknod=True)
    finally:
        del hosttree.TOPOLOGIES[spec.name]
    (tmp / "no-cdi").mkdir()
    config = hosts.slice_config(bench_bundles.slice_config(tmp / "rootfs", "/unused"), spec)
    held = [g.minor for g in spec.gpus[::every]] if every else [1]
    if every:
        env = [e for e in config["process"]["env"] if not e.startswith("NVIDIA_VISIBLE_DEVICES=")]
        uuids = ",".join(g.uuid for g in spec.gpus[::every])
        config["process"]["env"] = [*env, f"NVIDIA_VISIBLE_DEVICES={uuids}"]
    settings = settings_file(
        tmp, kubelet_checkpoint=str(tmp / "no-checkpoint"), kubelet_dra_state=str(tmp / "no-dra")
    )
    opts = {
        "--config": [str(settings)],
        "--driver-root": [str(tmp / "root")],
        "--cdi-spec-dir": [str(tmp / "no-cdi")],
    }
    stdin = json.dumps(config).encode()
    first = decide_spec(opts, stdin, Facts())  # caches written, imports done: the next one is a warm start
    assert first.code == 0 and first.out is not None and first.record is not None
    assert [
        k["path"]
        for k in first.record["keeps"]
        if k["path"].startswith("/dev/nvidia") and k["path"][11:].isdigit()
    ] == [f"/dev/nvidia{m}" for m in held]  # narrowed to its GPUs: the decision really folded an allow-list
    return lines_run(lambda: decide_spec(opts, stdin, Facts())), len(host_devices(tmp / "root").nodes)


@pytest.mark.parametrize("every", [0, 2], ids=["one-gpu", "every-other-gpu"])
def test_decide_spec_work_grows_no_faster_than_the_node(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, every: int
) -> None:
    """The slice pod holding one GPU (the fold's rules grow: one deny per other node), and every
    other GPU (the allocation grows too: IDs resolved, nodes kept and reported)."""
    monkeypatch.setattr(settingsfile, "FASTPATH_CACHE", tmp_path / "fastpath.json")
    (tmp_path / "small").mkdir(), (tmp_path / "big").mkdir()
    small, small_nodes = _node(tmp_path / "small", SMALL, every)
    big, big_nodes = _node(tmp_path / "big", BIG, every)
    whole = sum(big.values()) / sum(small.values())
    assert whole <= big_nodes / small_nodes, (sum(small.values()), sum(big.values()), small_nodes, big_nodes)
    steep = {
        Path(f).relative_to(HOOK).as_posix(): (small[f], n)
        for f, n in big.items()
        if n > small[f] * BIG / SMALL
    }
    assert not steep, f"grows faster than the GPUs ({BIG} / {SMALL}): {steep}"


def test_normalize_work_grows_no_faster_than_the_rules() -> None:
    """The slice pod's plan as the v2 writer normalizes it (``hook.adapters.apply.bpf``): allow-all,
    then one deny per other node. Linear up to a factor of two (terms per neighbour pair, a deny
    costing more than the allow): the old shadow dropping, a pass over every later rule per rule,
    made it 341x against a rule ratio of 28."""
    from hook.core.rules import Access, DeviceType, Rule, normalize

    def plan(n: int) -> list[Rule]:
        denies = [
            Rule(allow=False, type=DeviceType.CHAR, major=195, minor=m, access=Access.RWM) for m in range(n)
        ]
        return [Rule(allow=True), *denies]

    small, big = (sum(lines_run(lambda n=n: normalize(plan(n))).values()) for n in (SMALL, BIG))
    assert big / small <= 2 * (BIG + 1) / (SMALL + 1), (small, big)


def test_one_decision_builds_the_config_nodes_and_the_container_facts_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """decide, its narrowing and the report all ask for the config's nodes and the container's
    facts: a record per device each time, on a big node hundreds; one decision builds each once."""
    from hook.core import decide as decide_module
    from hook.core.record import last

    monkeypatch.setattr(settingsfile, "FASTPATH_CACHE", tmp_path / "fastpath.json")
    built: Counter[str] = Counter()

    def counted(name: str, fn: Any) -> Any:
        def call(arg: Any) -> Any:
            built[name] += 1
            return fn(arg)

        return last(call)

    monkeypatch.setattr(decide_module, "_config_nodes", counted("nodes", decide_module._nodes_of))
    monkeypatch.setattr(decide_module, "_facts", counted("facts", decide_module._container_facts))
    _node(tmp_path, SMALL, 0)  # the node's first decision, then the one counted in lines: two of each
    assert built == {"nodes": 2, "facts": 2}
