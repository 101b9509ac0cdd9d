"""Pure eBPF builder for BPF_PROG_TYPE_CGROUP_DEVICE: rules in, instruction bytes out.

Rule: this module decides what the kernel program says and nothing else; it loads nothing and
imports only struct and ``hook.core.record``. ``build_program`` and ``hook.core.rules.evaluate`` must
agree on every (type, major, minor, access) probe. Rules are read by their plain facts (type letter,
numbers, access bits), so the core's ``Rule`` and the wire's ``PlainRule`` build alike; a list the
caller says is ``normalized`` already (a served plan's, normalized where it was decided) is used as
it is, and only other lists load ``hook.core.rules.normalize`` (and ``enum`` with it).

Program layout (the ctx is ``struct bpf_cgroup_dev_ctx {u32 access_type; u32 major; u32 minor}``)::

    r0 = MAGIC ; r0 = DIGEST             marker: "this is ours, with these rules" (idempotency)
    w2 = type  ; w3 = pending access ; w4 = major ; w5 = minor
    block-0 .. block-k                   one block per normalized rule, LAST rule first
    block-k+1                            the runtime's original program, or "w0 = default; exit"

Per bit, the last rule naming it wins (OCI). Scanning from the last rule, ``w3`` holds the bits
not decided yet: a matching deny that names a pending bit denies at once; a matching allow clears
its bits and allows once nothing is pending; otherwise control falls to the next block. A
request our rules do not fully decide therefore gets exactly the original program's answer
(the original re-reads the whole request from the ctx).

The original is appended verbatim. That is sound because our code never writes R1 (the ctx
pointer, which the original reads first) nor R10, uses no stack, and the original's jumps are
relative and stay inside it; the verifier already proved it reads no register it did not set.
"""

from __future__ import annotations

import struct

from hook.core.record import record

TYPE_CHECKING = False  # typing is not imported at run time (start-up cost)
if TYPE_CHECKING:
    from collections.abc import Sequence

    from hook.core.plainplan import PlainRule
    from hook.core.rules import Rule

    AnyRule = Rule | PlainRule

__all__ = [
    "Insn",
    "MAGIC",
    "PROLOGUE_LEN",
    "build_program",
    "check_appendable",
    "decode",
    "disasm",
    "read_marker",
    "rule_code",
    "rules_digest",
    "RuleCode",
]

INSN_SIZE = 8
MAGIC = 0x6F64686B  # "odhk": first immediate of every program this hook builds
PROLOGUE_LEN = 8
_DEV_TYPE = {"b": 1, "c": 2}  # BPF_DEVCG_DEV_*, by the rule's type letter
_RWM = 7

# opcodes (class | size/op | source)
LDX_W, LDX_H, LDX_B, LDX_DW = 0x61, 0x69, 0x71, 0x79
MOV64_K, MOV32_K, MOV32_X = 0xB7, 0xB4, 0xBC
AND32_K, RSH32_K = 0x54, 0x74
JEQ_K, JNE_K, JA, CALL, EXIT = 0x15, 0x55, 0x05, 0x85, 0x95
JGT_K, JLT_K = 0x25, 0xA5  # unsigned; the ctx's u32 fields load zero-extended
_SPAN = 8  # this many same-effect rules on consecutive minors or more: one range block
LD_IMM64 = 0x18


@record(kw_only=False)
class Insn:
    """One 8-byte eBPF instruction; ``label`` is a jump target resolved by ``_link``."""

    op: int
    dst: int = 0
    src: int = 0
    off: int = 0
    imm: int = 0
    label: str | None = None

    def encode(self) -> bytes:
        imm = self.imm - (1 << 32) if self.imm >= 1 << 31 else self.imm
        return struct.pack("<BBhi", self.op, self.dst | self.src << 4, self.off, imm)


def decode(prog: bytes) -> list[Insn]:
    """Split program bytes into instructions (immediates as signed 32-bit, as the kernel stores them)."""
    if len(prog) % INSN_SIZE:
        raise ValueError(f"program length {len(prog)} is not a multiple of {INSN_SIZE}")
    out = []
    for pos in range(0, len(prog), INSN_SIZE):
        op, regs, off, imm = struct.unpack_from("<BBhi", prog, pos)
        out.append(Insn(op, regs & 0xF, regs >> 4, off, imm))
    return out


def _fnv1a(data: bytes) -> int:
    value = 0x811C9DC5
    for byte in data:
        value = ((value ^ byte) * 0x01000193) & 0xFFFFFFFF
    return value


def _prologue(digest: int) -> list[Insn]:
    return [
        Insn(MOV64_K, dst=0, imm=MAGIC),
        Insn(MOV64_K, dst=0, imm=digest),
        Insn(LDX_W, dst=2, src=1, off=0),
        Insn(AND32_K, dst=2, imm=0xFFFF),  # low 16 bits: BPF_DEVCG_DEV_*
        Insn(LDX_W, dst=3, src=1, off=0),
        Insn(RSH32_K, dst=3, imm=16),  # high 16 bits: BPF_DEVCG_ACC_*, the pending set
        Insn(LDX_W, dst=4, src=1, off=4),
        Insn(LDX_W, dst=5, src=1, off=8),
    ]


def _unconditional(rule: AnyRule) -> bool:
    return str(rule.type) == "a" and rule.major is None and rule.minor is None and rule.bits == _RWM


_INSN = struct.Struct("<BBhi")


def _block(rule: AnyRule, span: tuple[int, int] | None = None) -> bytes:
    """One rule's instructions, encoded; every mismatch jumps to the next block (the first byte
    after this one). Only R0, R3 and R6 are written. ``span``: the block stands for the same rule
    on every minor ``lo..hi`` (two compares instead of a block per minor)."""
    kind, bits = str(rule.type), rule.bits
    ops: list[tuple[int, int, int, bool]] = []  # (opcode, dst | src << 4, imm, jumps to the next block)
    if kind != "a":
        ops.append((JNE_K, 2, _DEV_TYPE[kind], True))
    if rule.major is not None:
        ops.append((JNE_K, 4, rule.major, True))
    if span is not None:
        ops += [(JLT_K, 5, span[0], True), (JGT_K, 5, span[1], True)]
    elif rule.minor is not None:
        ops.append((JNE_K, 5, rule.minor, True))
    partial = bits != _RWM
    if partial:  # does the rule name any pending bit? (R6 is scratch; R2 must survive)
        ops += [(MOV32_X, 6 | 3 << 4, 0, False), (AND32_K, 6, bits, False), (JEQ_K, 6, 0, True)]
    if rule.allow and partial:  # these bits are decided; others still need a later block
        ops += [(AND32_K, 3, ~bits, False), (JNE_K, 3, 0, True)]
    ops += [(MOV32_K, 0, int(rule.allow), False), (EXIT, 0, 0, False)]
    end = len(ops) - 1
    pack = _INSN.pack
    return b"".join(
        pack(op, regs, end - i if jump else 0, _signed(imm)) for i, (op, regs, imm, jump) in enumerate(ops)
    )


def _normal(rules: Sequence[AnyRule], normalized: bool) -> Sequence[AnyRule]:
    """``rules`` normalized (``hook.core.rules.normalize``), or as they are when they already are."""
    if normalized:
        return rules
    from hook.core.rules import normalize

    return normalize(rules)  # type: ignore[arg-type]  # core Rules: CgroupV2 reads plain ones back first


def _effect(rule: AnyRule) -> tuple[object, ...] | None:
    """What a rule does on any exact minor of its major, or None for a rule on every minor."""
    if rule.minor is None or rule.major is None or str(rule.type) == "a":
        return None
    return (rule.allow, str(rule.type), rule.major, rule.bits)


def _spans(rules: Sequence[AnyRule]) -> dict[int, tuple[int, int] | None]:
    """Position in ``rules`` -> the minor span its block stands for (None: nothing, covered by
    an earlier position's span), for every rule in a run of neighbours with one effect whose
    minors hold ``_SPAN`` or more consecutive numbers. Neighbours with one effect decide disjoint
    devices alike, so their order among themselves does not matter; ~2,000 IMEX channel denies
    become a few blocks (the kernel's program and verifier limits)."""
    out: dict[int, tuple[int, int] | None] = {}
    start = 0
    while start < len(rules):
        effect, end = _effect(rules[start]), start + 1
        while effect is not None and end < len(rules) and _effect(rules[end]) == effect:
            end += 1
        if end - start >= _SPAN:
            at = {r.minor: i for i, r in enumerate(rules[start:end], start) if r.minor is not None}
            minors = sorted(at)
            lo = 0
            for i in range(1, len(minors) + 1):
                if i == len(minors) or minors[i] != minors[i - 1] + 1:
                    if i - lo >= _SPAN:
                        run = minors[lo:i]
                        out.update(dict.fromkeys((at[m] for m in run), None))
                        out[min(at[m] for m in run)] = (run[0], run[-1])
                    lo = i
        start = end
    return out


def _rule_blocks(rules: Sequence[AnyRule]) -> tuple[bytes, bool]:
    """The blocks for normalized ``rules``, last rule first, encoded; and whether they end open
    (a request none of them decides falls to what follows)."""
    blocks: list[bytes] = []
    backwards = list(reversed(rules))
    spans = _spans(backwards)
    for at, rule in enumerate(backwards):
        if at in spans and spans[at] is None:
            continue  # its span's block decides it
        blocks.append(_block(rule, spans.get(at)))
        if _unconditional(rule):  # normalize puts it first; nothing after it can be reached
            return b"".join(blocks), False
    return b"".join(blocks), True


@record
class RuleCode:
    """The rule blocks of one rule list, built once: what every program wrapping them carries."""

    code: bytes
    digest: int  # build_program's marker: the FNV-1a of ``code``
    ends_open: bool


def rule_code(rules: Sequence[AnyRule], normalized: bool = False) -> RuleCode:
    """The blocks for ``rules`` and their digest; pass it to ``build_program`` for each program."""
    code, ends_open = _rule_blocks(_normal(rules, normalized))
    return RuleCode(code=code, digest=_fnv1a(code), ends_open=ends_open)


def _link(insns: list[Insn], labels: dict[str, int]) -> bytes:
    """Turn labels into relative jump offsets and encode."""
    out = bytearray()
    for pos, insn in enumerate(insns):
        if insn.label is not None:
            insn = Insn(insn.op, insn.dst, insn.src, labels[insn.label] - pos - 1, insn.imm)
        out += insn.encode()
    return bytes(out)


def rules_digest(rules: Sequence[AnyRule], normalized: bool = False) -> int:
    """A 32-bit fingerprint of the rule blocks ``build_program`` emits for ``rules``."""
    return rule_code(rules, normalized).digest


def read_marker(prog: bytes) -> int | None:
    """The rules digest if ``prog`` was built by ``build_program``, else None."""
    insns = decode(prog[: 2 * INSN_SIZE]) if len(prog) >= PROLOGUE_LEN * INSN_SIZE else []
    if len(insns) == 2 and insns[0] == Insn(MOV64_K, dst=0, imm=_signed(MAGIC)) and insns[1].op == MOV64_K:
        return insns[1].imm & 0xFFFFFFFF
    return None


def _signed(value: int) -> int:
    return value - (1 << 32) if value >= 1 << 31 else value


def check_appendable(prog: bytes) -> None:
    """Refuse an original program that cannot be re-loaded verbatim after our blocks.

    A zeroed or truncated dump (JIT hardening, restricted ``bpf_dump_raw_ok``) would otherwise
    become a silently wrong filter; calls and map references carry kernel-internal values in the
    translated dump, so they cannot be re-loaded either.
    """
    if not prog:
        raise ValueError("the original program dump is empty")
    for pos, insn in enumerate(decode(prog)):
        if insn.op == 0:
            raise ValueError(f"the original program dump is zeroed at instruction {pos} (JIT hardening?)")
        if insn.op in (CALL, 0x8D) or (insn.op == LD_IMM64 and insn.src != 0):
            raise ValueError(
                f"the original program uses calls or maps (instruction {pos}); cannot re-load it"
            )
    last = decode(prog)[-1]
    if last.op not in (EXIT, JA):
        raise ValueError("the original program does not end in exit or jump; the dump looks truncated")


def build_program(
    rules: Sequence[AnyRule],
    fallthrough: bytes | None,
    default_allow: bool,
    normalized: bool = False,
    code: RuleCode | None = None,
) -> bytes:
    """Our rules (normalized, last first), then ``fallthrough`` verbatim or ``w0 = default; exit``.

    ``default_allow`` only matters when ``fallthrough`` is None; R0 is always set on every path.
    ``normalized``: ``rules`` are ``normalize``'s output already (a served plan's ``normal``).
    ``code``: ``rule_code(rules, normalized)`` already built (a caller wrapping several programs).
    """
    if fallthrough is not None:
        check_appendable(fallthrough)
    if code is None:
        code = rule_code(rules, normalized)
    prologue = _prologue(code.digest)
    # The appended original starts by reading the ctx through R1: nothing of ours may write it
    # (the blocks write only R0, R3 and R6: ``_block``).
    if any(insn.dst in (1, 10) for insn in prologue):
        raise AssertionError("builder wrote R1 or R10; the appended original program would break")
    ours = _link(prologue, {}) + code.code
    if not code.ends_open:
        return ours
    if fallthrough is not None:
        return ours + fallthrough
    return ours + _link([Insn(MOV32_K, dst=0, imm=int(default_allow)), Insn(EXIT)], {})


_ALU_OPS = {
    0x00: "+=",
    0x10: "-=",
    0x20: "*=",
    0x30: "/=",
    0x40: "|=",
    0x50: "&=",
    0x60: "<<=",
    0x70: ">>=",
    0x90: "%=",
    0xA0: "^=",
    0xB0: "=",
    0xC0: "s>>=",
}
_JMP_OPS = {
    0x10: "==",
    0x20: ">",
    0x30: ">=",
    0x40: "&",
    0x50: "!=",
    0x60: "s>",
    0x70: "s>=",
    0xA0: "<",
    0xB0: "<=",
    0xC0: "s<",
    0xD0: "s<=",
}
_SIZES = {0x00: "u32", 0x08: "u16", 0x10: "u8", 0x18: "u64"}


def _text(insn: Insn, target: str | None) -> str:
    """bpftool-like text for one instruction; ``target`` names the jump destination."""
    cls, code, src = insn.op & 0x07, insn.op & 0xF0, insn.op & 0x08
    if cls == 0x01 and insn.op & 0xE0 == 0x60:  # LDX MEM
        return f"r{insn.dst} = *({_SIZES[insn.op & 0x18]} *)(r{insn.src} {insn.off:+d})"
    if cls in (0x04, 0x07) and code in _ALU_OPS:
        reg = "w" if cls == 0x04 else "r"
        rhs = f"{reg}{insn.src}" if src else str(insn.imm)
        return f"{reg}{insn.dst} {_ALU_OPS[code]} {rhs}"
    if cls in (0x05, 0x06) and insn.op == EXIT:
        return "exit"
    if cls in (0x05, 0x06) and code == 0x00 and cls == 0x05:
        return f"goto pc{insn.off:+d} <{target}>"
    if cls in (0x05, 0x06) and code in _JMP_OPS:
        reg = "w" if cls == 0x06 else "r"
        rhs = f"{reg}{insn.src}" if src else str(insn.imm)
        return f"if {reg}{insn.dst} {_JMP_OPS[code]} {rhs} goto pc{insn.off:+d} <{target}>"
    return f".insn op={insn.op:#04x} dst=r{insn.dst} src=r{insn.src} off={insn.off} imm={insn.imm}"


def _is_jump(insn: Insn) -> bool:
    return insn.op & 0x07 in (0x05, 0x06) and insn.op not in (EXIT, CALL)


def disasm(prog: bytes) -> str:
    """One line per instruction, ``block-N:`` before each block; for golden tests and humans.

    Blocks are found from the bytes alone: the first instruction after our prologue (when the
    marker is present) and every jump target start a block, numbered in program order.
    """
    insns = decode(prog)
    starts = {pos + 1 + insn.off for pos, insn in enumerate(insns) if _is_jump(insn)}
    if read_marker(prog) is not None:
        starts.add(PROLOGUE_LEN)
    names = {pos: f"block-{n}" for n, pos in enumerate(sorted(starts))}
    lines = []
    if read_marker(prog) is not None:
        lines.append("// marker: magic, rules digest")
    for pos, insn in enumerate(insns):
        if pos in names:
            lines.append(f"{names[pos]}:")
        target = names.get(pos + 1 + insn.off) if _is_jump(insn) else None
        lines.append(f"    {pos}: {_text(insn, target)}")
    return "\n".join(lines) + "\n"
