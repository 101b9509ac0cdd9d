# ruff: noqa: F811  (the fixtures sockdir, node and mig_node come from their own test files)
"""Issue 38 item 1: six checks that an independent mutation run could remove with every test
green, each pinned here by a test named for the rule it keeps.

Each test was run against the code with its check removed (the mutant named in its docstring)
and failed there; docs/testing.md lists them. They sit together because each plays the one
regression a real change could make, across modules that otherwise have their own test files.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from hook.core.errors import InputError
from hook.core.settings import DEFAULT_TRUSTED_NAMESPACES
from hook.routes import serve, wire
from hook.routes.decision import Live, from_wire
from hook.sources import warm
from hook.sources.kubelet.dra import parse_state
from hook.sources.nvidia import inventory
from tests.bundles import gen, state, write_bundle
from tests.dra_shapes import claim, device, dra_state, gpu_id, write_claim_spec
from tests.test_decider import a_container, ask_live, sockdir  # noqa: F401 (a fixture)
from tests.test_dra import CLAIM_A, POD_UID, gpu_claim, privileged_pod
from tests.test_dra import Node as DraNode
from tests.test_file_identity import GI_DIR, NEW_UUID, TICK, decide_env, mig_node  # noqa: F401
from tests.test_k8s import pod_config, run
from tests.test_kubelet_word import ALL, ENGINES, no_gpu_granted, node  # noqa: F401


def serve_in(
    where: Path, opts: dict[str, list[str]], settings: str
) -> tuple[serve.Decider, threading.Thread]:
    d = serve.Decider(str(where), key=wire.make_key(), opts=opts, settings_path=settings)
    d.listen()
    t = threading.Thread(target=d.run, daemon=True)
    t.start()
    return d, t


# --- 1. the client's nonce: an exchange recorded once answers no later request --------------------


class Relay:
    """A listener at the decider's socket path that forwards the first connection to the real
    decider and records what it answered, then plays that recording to every later connection:
    the listener that once sat between a hook and its decider (the node's /run is reachable)."""

    def __init__(self, at: Path, upstream: Path) -> None:
        self.upstream, self.recorded = upstream, b""
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(str(at))
        self.sock.listen(4)
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        first = True
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn:
                if first:
                    self._forward(conn)
                    first = False
                else:
                    self._drain(conn)
                    conn.sendall(self.recorded)

    def _forward(self, conn: socket.socket) -> None:
        up = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        up.connect(str(self.upstream))

        def pump() -> None:
            while data := conn.recv(65536):
                up.sendall(data)

        threading.Thread(target=pump, daemon=True).start()
        while data := up.recv(65536):  # passed on as it comes: the hook closes once answered
            self.recorded += data
            conn.sendall(data)
        up.close()

    @staticmethod
    def _drain(conn: socket.socket) -> None:
        conn.settimeout(0.3)
        try:
            while conn.recv(65536):
                pass
        except TimeoutError:
            pass

    def close(self) -> None:
        self.sock.close()


def test_a_recorded_exchange_never_answers_a_second_identical_request(
    tmp_path: Path,
    sockdir: Path,
) -> None:
    """Mutant: a constant nonce (``nonce = b"0" * 32``). Two identical requests (a retried create, a
    status) then carry the same MAC, so a listener that recorded one genuine answer can replay it
    later, after the node changed, and the hook takes it as the decider's word."""
    opts, stdin, _ = a_container(tmp_path)
    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    decider, t = serve_in(real, opts, opts["--config"][0])
    relay = Relay(sockdir / wire.SOCKET_NAME, real / wire.SOCKET_NAME)
    try:
        got, body = ask_live(opts, stdin)
        assert got == "answered" and isinstance(body, bytes), body  # through the relay, genuine
        assert body in relay.recorded  # the genuine answer and its proof, recorded
        got, why = ask_live(opts, stdin)  # the same container, the same bytes: only the nonce differs
        assert got == "untrusted", (got, why)
        assert "untrusted listener" in str(why)
    finally:
        relay.close()
        decider.close()
        t.join(5)


# --- 2. the options fingerprint covers the CDI spec dirs -------------------------------------------


def test_a_hook_with_its_own_cdi_spec_dir_is_not_answered_from_other_specs(
    tmp_path: Path,
    sockdir: Path,
) -> None:
    """Mutant: ``--cdi-spec-dir`` dropped from ``wire.fingerprint``'s options. A hook run with a
    spec dir of its own would then be answered by a decider reading other specs."""
    opts, stdin, _ = a_container(tmp_path)
    mine = tmp_path / "my-specs"
    mine.mkdir()
    settings = opts["--config"][0]
    base = wire.fingerprint(opts, settings)
    with_dir = {**opts, "--cdi-spec-dir": [str(mine)]}
    assert wire.fingerprint(with_dir, settings) != base
    other = tmp_path / "other-specs"
    other.mkdir()
    theirs = wire.fingerprint({**opts, "--cdi-spec-dir": [str(other)]}, settings)
    assert theirs != wire.fingerprint(with_dir, settings)
    decider, t = serve_in(sockdir, opts, settings)  # the node's decider: no spec dir of the hook's
    try:
        got, why = ask_live(with_dir, stdin)
        assert got == "declined", (got, why)
        assert ask_live(opts, stdin)[0] == "answered"  # the same hook without it is served
    finally:
        decider.close()
        t.join(5)


# --- 3. the kubelet's word gates a pod's CDI annotation under every env policy --------------------


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("env_requests", ["auto", "always", "never"])
@pytest.mark.parametrize("namespace", ["ml", DEFAULT_TRUSTED_NAMESPACES[0]])
def test_a_pods_own_cdi_annotation_allocates_nothing_under_every_env_policy(
    engine: str,
    env_requests: str,
    namespace: str,
    tmp_path: Path,
    node: dict[str, Path],
    capsys: Any,
) -> None:
    """Mutant: the annotation gate tied to the env policy (only under ``env_requests: auto`` in an
    untrusted namespace). A pod's own ``cdi.k8s.io/x: nvidia.com/gpu=all`` then allocates every GPU
    under ``always`` or ``never``, and with the default settings in the trusted namespaces. The
    env policy speaks for the NVIDIA env; an annotation is the pod's own write either way."""
    cfg = pod_config(engine, image_env=["PATH=/bin"], namespace=namespace, extra_annotations=ALL)
    rep = run(tmp_path, node, cfg, capsys, env_requests=env_requests)  # the kubelet allocated nothing
    assert rep["verdict"] == "none", rep
    no_gpu_granted(rep)
    assert rep["requests"] == []


# --- 4. a warm view of a file reached through a symlink (a ConfigMap mount) -----------------------


def configmap(dir_: Path, generation: str, text: str) -> Path:
    """The kubelet's ConfigMap volume: ``config.yaml -> ..data/config.yaml``, ``..data -> ..<gen>``;
    an update writes a new ``..<gen>`` and re-points ``..data`` with one rename."""
    (dir_ / generation).mkdir(parents=True)
    (dir_ / generation / "config.yaml").write_text(text)
    tmp_link = dir_ / "..data_tmp"
    os.symlink(generation, tmp_link)
    os.rename(tmp_link, dir_ / "..data")
    link = dir_ / "config.yaml"
    if not link.is_symlink():
        os.symlink("..data/config.yaml", link)
    return link


@pytest.fixture
def warm_on() -> Iterator[None]:
    warm.enable()
    yield
    warm.enable(False)


def test_the_decider_sees_a_configmap_settings_update_through_its_symlinks(
    tmp_path: Path,
    sockdir: Path,
    warm_on: None,
) -> None:
    """Mutant: a file's identity taken without following the link (``os.lstat`` in
    ``warm.identity``). The link ``config.yaml`` never changes when ``..data`` is re-pointed, so
    the decider would decide with the old settings until it restarts."""
    base = {"log_file": str(tmp_path / "hook.log"), "cache_dir": str(tmp_path / "cache")}
    cm = tmp_path / "cm"
    settings = configmap(cm, "..2026_12_06_1", json.dumps({**base, "privileged_allocation": "narrow"}) + "\n")
    bundle = write_bundle(tmp_path / "b", gen.bundles()["slice-privileged"])
    inventory_file = Path(gen.__file__).parent / "node" / "inventory.json"
    opts = {"--config": [str(settings)], "--inventory": [str(inventory_file)]}
    stdin = state(bundle, id="ctr-cm")
    decider, t = serve_in(sockdir, opts, str(settings))
    try:
        got, body = ask_live(opts, stdin)
        assert got == "answered" and isinstance(body, bytes), body
        first = from_wire(body)
        assert isinstance(first, Live) and first.record["verdict"] == "apply", first.record
        time.sleep(TICK)
        configmap(cm, "..2026_12_06_2", json.dumps({**base, "privileged_allocation": "reject"}) + "\n")
        got, body = ask_live(opts, stdin)
        assert got == "answered" and isinstance(body, bytes), body
        second = from_wire(body)
        assert isinstance(second, Live) and second.record["verdict"] == "deny", second.record
    finally:
        decider.close()
        t.join(5)


# --- 5. a malformed DRA entry is reported, never skipped -------------------------------------------


def drifted_state() -> bytes:
    """The pod's own claim, and a second entry whose pod list is a JSON list (a format drift under
    a valid checksum): it may be this pod's claim in another shape."""
    good = gpu_claim(CLAIM_A, 2)
    drifted = claim("c2", "gpu-3", [], [device([gpu_id("c2", 3)], "gpu-3")]) | {"PodUIDs": [POD_UID]}
    return dra_state([good, drifted])


def test_a_dra_entry_whose_pod_list_is_not_an_object_is_reported_for_every_pod() -> None:
    """Mutant: ``_mine`` skipping an entry whose ``PodUIDs`` is not an object (instead of decoding
    it so its error is reported). The pod's view would then silently lack a claim that may be its
    own, and decide as if the state were whole."""
    with pytest.raises(InputError) as exc:
        parse_state(drifted_state(), "dra", pod_uid=POD_UID)
    assert exc.value.field.endswith("PodUIDs"), exc.value.field
    with pytest.raises(InputError):
        parse_state(drifted_state(), "dra", pod_uid="another-pod")  # whichever pod asks


def test_a_privileged_dra_pod_with_a_drifted_state_is_not_decided_from_part_of_it(
    tmp_path: Path, k8s_root: Path, capsys: Any
) -> None:
    dra = DraNode(tmp_path, k8s_root)
    write_claim_spec(dra.cdi, CLAIM_A, gpus=[2])
    dra.dra.write_bytes(drifted_state())
    rc, rep, _ = dra.simulate(privileged_pod("containerd", (0, 1, 2, 3), {"gpus": [2]}), capsys)
    assert rc == 0 and rep["kubernetes"]["dra"]["state"] != "read", rep["kubernetes"]["dra"]
    (warning,) = [w for w in rep["warnings"] if "DRA" in w]
    assert "PodUIDs" in warning and warning.startswith(str(dra.dra)), warning


@pytest.fixture(scope="module")
def k8s_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tests.hosttree import make_host_tree

    root = tmp_path_factory.mktemp("pin-dra-node") / "root"
    make_host_tree(root, "4x-k8s", mknod=True)
    return root


# --- 6. a MIG instance's incarnation is told by ctime too ------------------------------------------


def remake_in_place(mig: dict[str, Any]) -> str:
    """GI 2 destroyed and made again where its capability files come back with the same inode,
    size and mtime (a reused inode, times at the filesystem's granularity): only ``st_ctime_ns``
    tells the incarnations apart. NVML now names the instance by a new UUID. Returns the old."""
    import dataclasses

    from tests.nvidia.fake_pynvml import FakeNvml

    spec = mig["spec"]
    old = spec.migs[1]
    time.sleep(TICK)
    for path in sorted((mig["root"] / GI_DIR).rglob("access")):
        st = path.stat()
        path.write_bytes(path.read_bytes())
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
        after = path.stat()
        assert (after.st_ino, after.st_size, after.st_mtime_ns) == (st.st_ino, st.st_size, st.st_mtime_ns)
        assert after.st_ctime_ns != st.st_ctime_ns
    new = dataclasses.replace(old, uuid=NEW_UUID)
    mig["fake"]["nvml"] = FakeNvml(dataclasses.replace(spec, migs=(spec.migs[0], new)))
    return str(old.uuid)


def test_a_mig_instance_remade_with_the_same_inode_and_mtime_is_a_new_incarnation(
    mig_node: dict[str, Any],
) -> None:
    """Mutant: ``st_ctime_ns`` dropped from ``inventory.incarnations``' per-instance identity. The
    cached inventory would then hand out the old UUID for the remade instance's caps."""
    root, cache = mig_node["root"], mig_node["cache"]
    assert inventory.load(root, None, cache, need_migs=True).source == "proc+nvml"
    assert inventory.load(root, None, cache, need_migs=True).source == "cache"
    old = remake_in_place(mig_node)
    inv = inventory.load(root, None, cache, need_migs=True)
    assert inv.source == "proc+nvml"
    assert NEW_UUID in {m.uuid for m in inv.migs} and old not in {m.uuid for m in inv.migs}
    with pytest.raises(InputError, match="unknown device ID"):
        decide_env(mig_node, old)
