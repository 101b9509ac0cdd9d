"""The decider-served floor client: the least a per-start process can do and still be decided for.

Rule: a script, run as ``python3 -ISB`` (the hook's own flags), that loads only ``os``, ``sys``,
``_socket``, ``_blake2`` and ``_json`` and leaves everything else to the decider: it MACs the
request with the node key, sends what the runtime handed it, checks the answer's MAC and acts as
little as the route allows. It is the bound the shipped client is measured against (issue 35),
not a hook: it logs nothing, guards nothing and exits 1 on anything but an answer, so a row of it
is decider-served or the bench stops. The wire's constants (magic, protocol, version, paths) are
written in by ``install`` from ``hook.routes.wire`` and ``hook.core.version`` of the tree under
test, so a protocol change makes this fail loudly, never measure something else.

- ``prestart --config S`` (runc's prestart hook): the state on stdin, the bundle's config.json;
  asks ``live``; no apply.
- ``runtime-wrapper --config S -- RUNTIME ARGS`` (``packaging/runtime``'s ``hook``): on create
  or run, asks ``precreate`` with the config and the container id, writes the decided config
  (a temporary file, fsync, rename), then execs the runtime.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

__all__ = ["install", "SCRIPT"]

SCRIPT = r'''
import os, sys
import _socket, _json
from _blake2 import blake2b

KEY, SOCK, MAGIC, PROTOCOL, VERSION, PERSON = @CONSTANTS@


def mac(key, *parts):
    h = blake2b(key=key, digest_size=32, person=PERSON)
    for part in parts:
        h.update(len(part).to_bytes(8, "big"))
        h.update(part)
    return h.digest()


def frame(kind, payload):
    return kind + len(payload).to_bytes(4, "big") + payload


def exactly(sock, n):
    out = b""
    while len(out) < n:
        chunk = sock.recv(n - len(out))
        if not chunk:
            raise SystemExit("floor client: the decider closed the connection")
        out += chunk
    return out


def read_frame(sock):
    head = exactly(sock, 5)
    return head[:1], exactly(sock, int.from_bytes(head[1:], "big"))


def fingerprint(settings):
    st = os.stat(settings)
    ident = ":".join(map(str, (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)))
    return mac(b"", os.path.abspath(settings).encode(), ident.encode(), b"True")


def ask(route, settings, parts):
    with open(KEY, "rb") as f:
        key = f.read()
    sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
    sock.settimeout(0.4)
    sock.connect(SOCK)
    nonce = os.urandom(16).hex().encode()
    words = (MAGIC, PROTOCOL, VERSION, route, fingerprint(settings).hex().encode(), nonce)
    head = frame(b"Q", b"\0".join(words))
    body = head + frame(b"M", mac(key, b"head", head)) + b"".join(frame(k, p) for k, p in parts)
    tag = mac(key, b"request", body)
    sock.sendall(body + frame(b"M", tag))
    kind, payload = read_frame(sock)
    mkind, proof = read_frame(sock)
    sock.close()
    if kind != b"A" or mkind != b"M" or proof != mac(key, b"answer", tag, kind, payload):
        raise SystemExit(f"floor client: not answered ({kind!r}: {payload[:200]!r})")
    return payload.decode("ascii")


def field(text, name, last=False):
    """The JSON value of key ``name`` in ``text`` (its first or ``last`` occurrence: the answer's
    "code" precedes its record, its "out" follows it): a string, None or an integer."""
    at = (text.rfind if last else text.find)(f'"{name}":')
    if at < 0:
        return None
    at += len(name) + 3
    while text[at] == " ":
        at += 1
    if text[at] == '"':
        return _json.scanstring(text, at + 1, True)[0]
    end = at
    while text[end] not in ",}":
        end += 1
    word = text[at:end].strip()
    return None if word == "null" else int(word)


def prestart(settings):
    state = sys.stdin.buffer.read()
    bundle = field(state.decode(), "bundle")
    with open(os.path.join(bundle, "config.json"), "rb") as f:
        config = f.read()
    answer = ask(b"live", settings, [(b"S", state), (b"C", config)])
    return field(answer, "code")


def wrapper(settings, args):
    command = next((a for a in args if a in ("create", "run", "restore")), None)
    if command is not None:
        bundle = "."
        for i, a in enumerate(args):
            if a in ("--bundle", "-b"):
                bundle = args[i + 1]
        path = os.path.join(bundle, "config.json")
        with open(path, "rb") as f:
            config = f.read()
        answer = ask(b"precreate", settings, [(b"C", config), (b"F", b"id=" + args[-1].encode())])
        code = field(answer, "code")
        if code:
            return code
        out = field(answer, "out", last=True)
        if out is not None:
            tmp = path + ".floor"
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            try:
                os.write(fd, out.encode("utf-8", "surrogateescape"))
                os.fsync(fd)
            finally:
                os.close(fd)
            os.rename(tmp, path)
    os.execv(args[0], args)


argv = sys.argv[1:]
if argv[:1] == ["prestart"]:
    sys.exit(prestart(argv[2]))
sys.exit(wrapper(argv[2], argv[argv.index("--") + 1:]))
'''


def install(dest: Path, interp: str) -> Path:
    """The floor client at ``dest`` (``#!interp -ISB``), its constants from the tree under test."""
    from hook.core.version import VERSION
    from hook.routes import wire

    constants = (
        f"{wire.KEY_DIR}/{wire.KEY_NAME}",
        os.path.join(wire.SOCKET_DIR, wire.SOCKET_NAME),
        wire.MAGIC,
        wire.PROTOCOL,
        VERSION.encode(),
        b"odh-decider-v2",
    )
    script = SCRIPT.replace("@CONSTANTS@", repr(constants))
    scope: dict[str, object] = {"__name__": "floorclient"}
    exec(script.partition("\n\nargv = ")[0], scope)  # its MAC, checked against the wire's own
    if scope["mac"](b"k" * 32, b"a", b"bc") != wire.mac(b"k" * 32, b"a", b"bc"):  # type: ignore[operator]
        raise RuntimeError("bench/floorclient.py: its MAC is not hook.routes.wire.mac: update it")
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_text(f"#!{interp} -ISB\n" + script)
    dest.chmod(0o755)
    return dest


if __name__ == "__main__":
    sys.exit(f"{sys.argv[0]}: not run directly: bench.floorclient.install writes the script")
