"""The pure eBPF builder: instruction bytes, golden listings, and agreement with ``rules.evaluate``."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hook.adapters.apply import bpf
from hook.core.rules import ALLOW_ALL, DENY_ALL, Access, DeviceType, Rule, evaluate, normalize

GOLDEN = Path(__file__).resolve().parent.parent / "golden" / "bpf"
C, B, A = DeviceType.CHAR, DeviceType.BLOCK, DeviceType.ALL
RWM, RW, R, M = Access.RWM, Access.R | Access.W, Access.R, Access.M

RUNC_DEFAULTS = (
    DENY_ALL,
    Rule(allow=True, type=C, access=M),
    Rule(allow=True, type=B, access=M),
    *(
        Rule(allow=True, type=C, major=ma, minor=mi)
        for ma, mi in ((1, 3), (1, 8), (1, 7), (5, 0), (1, 5), (1, 9))
    ),
    Rule(allow=True, type=C, major=136),
    Rule(allow=True, type=C, major=5, minor=2),
    Rule(allow=True, type=C, major=10, minor=200),
)


# ---- single instructions against known bytes (libnvidia-container's prog_test dump) ----


@pytest.mark.parametrize(
    ("insn", "hexbytes"),
    [
        (bpf.Insn(bpf.LDX_W, dst=2, src=1, off=0), "6112000000000000"),
        (bpf.Insn(bpf.AND32_K, dst=2, imm=0xFFFF), "54020000ffff0000"),
        (bpf.Insn(bpf.RSH32_K, dst=3, imm=16), "7403000010000000"),
        (bpf.Insn(bpf.LDX_W, dst=5, src=1, off=8), "6115080000000000"),
        (bpf.Insn(bpf.JNE_K, dst=2, off=3, imm=2), "5502030002000000"),
        (bpf.Insn(bpf.MOV32_X, dst=1, src=3), "bc31000000000000"),
        (bpf.Insn(bpf.JEQ_K, dst=6, off=-1, imm=0), "1506ffff00000000"),
        (bpf.Insn(bpf.AND32_K, dst=3, imm=-7), "54030000f9ffffff"),
        (bpf.Insn(bpf.MOV64_K, dst=0, imm=1), "b700000001000000"),
        (bpf.Insn(bpf.EXIT), "9500000000000000"),
    ],
    ids=lambda v: v.hex() if isinstance(v, bytes) else str(v),
)
def test_single_instruction_bytes(insn: bpf.Insn, hexbytes: str) -> None:
    assert insn.encode().hex() == hexbytes
    assert bpf.decode(bytes.fromhex(hexbytes)) == [insn]


def test_jumps_resolve_to_the_next_block() -> None:
    prog = bpf.decode(
        bpf.build_program([Rule(allow=True, type=C, major=195, minor=0, access=RW)], None, False)
    )
    jumps = [(pos, insn) for pos, insn in enumerate(prog) if insn.op in (bpf.JNE_K, bpf.JEQ_K)]
    assert jumps, "a specific rule must test something"
    targets = {pos + 1 + insn.off for pos, insn in jumps}
    assert targets == {len(prog) - 2}, "every mismatch lands on the default block"
    assert prog[-2:] == [bpf.Insn(bpf.MOV32_K, dst=0, imm=0), bpf.Insn(bpf.EXIT)]


# ---- golden listings ----


@dataclass(frozen=True)
class Case:
    name: str
    rules: tuple[Rule, ...]
    runc_fallthrough: bool = False
    default_allow: bool = False
    note: str = ""


GPU0 = Rule(allow=True, type=C, major=195, minor=0, access=RW)
CASES = [
    Case("empty", (), note="no rules, default deny: one block"),
    Case("privileged", (ALLOW_ALL,), note="allow-all is unconditional: nothing after it"),
    Case(
        "privileged_minus_gpu1",
        (ALLOW_ALL, Rule(allow=False, type=C, major=195, minor=1)),
        note="deny c 195:1 checked first, then the allow-all block",
    ),
    Case(
        "runc_defaults_plus_gpu0", (*RUNC_DEFAULTS, GPU0), note="runc's default allow-list, then c 195:0 rw"
    ),
    Case(
        "mig_caps",
        (GPU0, *(Rule(allow=True, type=C, major=237, minor=n, access=R) for n in (1, 12, 13))),
        note="GPU 0 rw plus MIG config, GI and CI caps read-only (c 237:N r)",
    ),
    Case(
        "fallthrough_runc",
        (
            Rule(allow=True, type=C, major=195, minor=1, access=RW),
            Rule(allow=False, type=C, major=195, minor=0),
        ),
        runc_fallthrough=True,
        note="our two blocks, then a runc-shaped program verbatim",
    ),
]


def _canon(text: str) -> list[str]:
    """runc's golden comparison: no blank lines, no indentation, no ``//`` lines."""
    lines = (line.strip() for line in text.splitlines())
    return [line for line in lines if line and not line.startswith("//")]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_golden_listing(case: Case, update_golden: bool, runc_program: bytes) -> None:
    fallthrough = runc_program if case.runc_fallthrough else None
    listing = bpf.disasm(bpf.build_program(case.rules, fallthrough, case.default_allow))
    path: Path = GOLDEN / f"{case.name}.txt"
    if update_golden:
        rules = "\n".join(f"// {'allow' if r.allow else 'deny'} {r.v1_line()}" for r in case.rules)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"// {case.note}\n{rules}\n\n{listing}")
    assert path.exists(), f"missing {path}; run pytest with --update-golden"
    assert _canon(listing) == _canon(path.read_text())


def test_golden_comparison_ignores_only_comments_and_layout() -> None:
    assert _canon("// x\n\n   1: exit\n") == ["1: exit"]
    assert _canon("1: exit") != _canon("1: w0 = 1")


# ---- semantics: the program and the emulator agree ----

majors = st.sampled_from([1, 195, 237])
minors = st.sampled_from([0, 1, 255])
accesses = st.sampled_from([Access.R, Access.W, Access.M, RW, Access.R | Access.M, RWM])
rule_st = st.builds(
    Rule,
    allow=st.booleans(),
    type=st.sampled_from([A, C, B]),
    major=st.none() | majors,
    minor=st.none() | minors,
    access=accesses,
)
probe_st = st.tuples(st.sampled_from([C, B]), majors, minors, accesses)


@settings(max_examples=400, deadline=None)
@given(
    rules=st.lists(rule_st, max_size=8),
    probes=st.lists(probe_st, min_size=1, max_size=12),
    default_allow=st.booleans(),
)
def test_program_agrees_with_evaluate(rules: list[Rule], probes: list, default_allow: bool, bpf_run) -> None:
    prog = bpf.build_program(rules, None, default_allow)
    for type_, major, minor, access in probes:
        want = evaluate(rules, type_, major, minor, access, default_allow)
        assert bpf_run(prog, type_, major, minor, access) == int(want), (type_, major, minor, access)


def _runtime(type_: DeviceType, major: int, minor: int, access: Access) -> bool:
    """What the conftest ``runc_program`` answers (exact cover by one rule)."""
    if type_ is not C:
        return False
    return (
        (major, minor) == (1, 3)
        or access == M
        or ((major, minor) == (195, 0) and access & ~RW == Access.NONE)
    )


@settings(max_examples=300, deadline=None)
@given(rules=st.lists(rule_st, max_size=6), probes=st.lists(probe_st, min_size=1, max_size=12))
def test_fallthrough_gets_every_request_our_rules_leave_open(
    rules: list[Rule], probes: list, runc_program: bytes, bpf_run
) -> None:
    prog = bpf.build_program(rules, runc_program, default_allow=False)
    for type_, major, minor, access in probes:
        some_bit_denied = not evaluate(rules, type_, major, minor, access, default_allow=True)
        every_bit_allowed = evaluate(rules, type_, major, minor, access, default_allow=False)
        want = False if some_bit_denied else every_bit_allowed or _runtime(type_, major, minor, access)
        assert bpf_run(prog, type_, major, minor, access) == int(want)


def test_runc_like_program_matches_its_model(runc_program: bytes, bpf_run) -> None:
    """Guards the fallthrough test's oracle itself."""
    prog = runc_program
    for type_ in (C, B):
        for major, minor in ((1, 3), (195, 0), (195, 1)):
            for access in (R, Access.W, RW, M, RWM):
                assert bpf_run(prog, type_, major, minor, access) == int(
                    _runtime(type_, major, minor, access)
                )


# ---- structure, marker and refusals ----


def test_our_code_never_writes_r1_or_r10() -> None:
    ours = bpf.decode(bpf.build_program([*RUNC_DEFAULTS, GPU0], None, False))
    assert all(insn.dst not in (1, 10) for insn in ours)


def test_marker_carries_the_rules_digest(runc_program: bytes) -> None:
    prog = bpf.build_program([GPU0], runc_program, False)
    assert bpf.read_marker(prog) == bpf.rules_digest([GPU0])
    assert bpf.read_marker(runc_program) is None
    assert bpf.rules_digest([GPU0]) != bpf.rules_digest(
        [Rule(allow=True, type=C, major=195, minor=1, access=RW)]
    )
    assert bpf.rules_digest([GPU0, GPU0]) == bpf.rules_digest([GPU0]), "digest is of normalized rules"


def test_fallthrough_is_appended_verbatim(runc_program: bytes) -> None:
    orig = runc_program
    prog = bpf.build_program([GPU0], orig, False)
    assert prog.endswith(orig)
    assert bpf.build_program([ALLOW_ALL], orig, False).find(orig) == -1, "unreachable after allow-all"


_DENY = bpf.Insn(bpf.MOV32_K, dst=0, imm=0).encode() + bpf.Insn(bpf.EXIT).encode()


@pytest.mark.parametrize(
    ("name", "orig", "message"),
    [
        ("zeroed dump", bytes(48), "zeroed"),
        ("empty dump", b"", "empty"),
        ("helper call", bpf.Insn(bpf.CALL, imm=14).encode() + bpf.Insn(bpf.EXIT).encode(), "calls or maps"),
        (
            "map load",
            # the kernel's opcode (BPF_LD | BPF_DW | BPF_IMM), not bpf.LD_IMM64: a wrong constant in
            # the module must not pass its own test (issue 24, fresh mutant s530669-092)
            bpf.Insn(0x18, dst=1, src=1, imm=3).encode() + bytes(8) + bpf.Insn(bpf.EXIT).encode(),
            "calls or maps",
        ),
        ("truncated", _DENY[:8], "truncated"),
        ("ragged", _DENY[:-3], "multiple of 8"),
    ],
    ids=lambda v: v if isinstance(v, str) else "",
)
def test_refuses_an_original_it_cannot_reload(name: str, orig: bytes, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        bpf.build_program([GPU0], orig, False)


def test_builder_normalizes_first() -> None:
    twice = bpf.build_program([GPU0, GPU0, DENY_ALL, GPU0], None, False)
    assert twice == bpf.build_program(normalize([DENY_ALL, GPU0]), None, False)


def test_disasm_spells_each_instruction_form() -> None:
    """The golden listings only hold what the builder emits; the disassembler also reads runc's and
    crun's programs, so every form it knows is pinned here (mod, 64-bit shifts, signed shifts,
    ``ja``, 32-bit jumps, register compares, and the fallback for an unknown opcode)."""
    i = bpf.Insn
    prog = [
        i(0x61, dst=2, src=1, off=4),
        i(0x94, dst=1, imm=3),
        i(0x67, dst=3, imm=2),
        i(0xCC, dst=4, src=5),
        i(0x05, off=2),
        i(0x16, dst=2, imm=7, off=1),
        i(0x5D, dst=1, src=3, off=0),
        i(0xB4, dst=0, imm=1),
        i(bpf.EXIT),
        i(0xFF, dst=1, src=2, off=3, imm=9),
    ]
    assert bpf.disasm(b"".join(x.encode() for x in prog)).splitlines() == [
        "    0: r2 = *(u32 *)(r1 +4)",
        "    1: w1 %= 3",
        "    2: r3 <<= 2",
        "    3: w4 s>>= w5",
        "    4: goto pc+2 <block-0>",
        "    5: if w2 == 7 goto pc+1 <block-0>",
        "    6: if r1 != r3 goto pc+0 <block-0>",
        "block-0:",
        "    7: w0 = 1",
        "    8: exit",
        "    9: .insn op=0xff dst=r1 src=r2 off=3 imm=9",
    ]


ALU_TEXT = {0x00: "+=", 0x10: "-=", 0x20: "*=", 0x30: "/=", 0x40: "|=", 0x50: "&=", 0x60: "<<=", 0x70: ">>=",
            0x90: "%=", 0xA0: "^=", 0xB0: "=", 0xC0: "s>>="}  # fmt: skip
JMP_TEXT = {0x10: "==", 0x20: ">", 0x30: ">=", 0x40: "&", 0x50: "!=", 0x60: "s>", 0x70: "s>=", 0xA0: "<",
            0xB0: "<=", 0xC0: "s<", 0xD0: "s<="}  # fmt: skip


@pytest.mark.parametrize(("code", "text"), sorted(ALU_TEXT.items()))
def test_disasm_alu_operators(code: int, text: str) -> None:
    """bpftool's spelling of each ALU operation, 32-bit (``w``) and 64-bit (``r``), K and X forms."""
    prog = [bpf.Insn(code | 0x04, dst=1, imm=5), bpf.Insn(code | 0x07 | 0x08, dst=2, src=3)]
    lines = bpf.disasm(b"".join(x.encode() for x in prog)).splitlines()
    assert lines == [f"    0: w1 {text} 5", f"    1: r2 {text} r3"]


@pytest.mark.parametrize(("code", "text"), sorted(JMP_TEXT.items()))
def test_disasm_jump_operators(code: int, text: str) -> None:
    prog = [
        bpf.Insn(code | 0x05, dst=1, imm=5, off=1),
        bpf.Insn(code | 0x06 | 0x08, dst=2, src=3),
        bpf.Insn(bpf.EXIT),
    ]
    lines = bpf.disasm(b"".join(x.encode() for x in prog)).splitlines()
    assert lines == [
        f"    0: if r1 {text} 5 goto pc+1 <block-0>",
        f"    1: if w2 {text} w3 goto pc+0 <block-0>",
        "block-0:",
        "    2: exit",
    ]


def test_builder_that_would_clobber_r1_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """The appended runtime program reads the ctx through R1: the guard in build_program stops a
    (future, broken) builder that writes R1 before the program is ever loaded."""
    real = bpf._prologue
    monkeypatch.setattr(bpf, "_prologue", lambda digest: [*real(digest), bpf.Insn(bpf.MOV32_K, dst=1, imm=0)])
    with pytest.raises(AssertionError, match="R1 or R10"):
        bpf.build_program([], None, default_allow=False)


# ---- range blocks: many same-effect rules on consecutive minors (issue 36 item 5, IMEX channels) ----

span_rule = st.builds(
    Rule,
    allow=st.booleans(),
    type=st.just(C),
    major=st.sampled_from([234, 235]),
    minor=st.integers(0, 40),
    access=st.sampled_from([RWM, RW]),
)


@settings(max_examples=150, deadline=None)
@given(
    head=st.lists(rule_st, max_size=3),
    spans=st.lists(st.tuples(st.integers(0, 30), st.integers(0, 14)), max_size=3),
    holes=st.sets(st.integers(0, 40), max_size=3),
    tail=st.lists(span_rule, max_size=6),
    default_allow=st.booleans(),
)
def test_range_blocks_agree_with_evaluate(
    head: list[Rule],
    spans: list[tuple[int, int]],
    holes: set[int],
    tail: list[Rule],
    default_allow: bool,
    bpf_run,
) -> None:
    """A privileged pod's shape: rules, runs of exact denies on one major, then more rules."""
    denied = {m for lo, n in spans for m in range(lo, lo + n)} - holes
    runs = [Rule(allow=False, type=C, major=234, minor=m) for m in sorted(denied)]
    rules = [*head, *runs, *tail]
    prog = bpf.build_program(rules, None, default_allow)
    for major in (234, 235):
        for minor in range(42):
            for access in (R, M, RWM):
                want = evaluate(rules, C, major, minor, access, default_allow)
                assert bpf_run(prog, C, major, minor, access) == int(want), (major, minor, access)


def test_two_thousand_channel_denies_are_a_few_blocks(bpf_run) -> None:
    """A pod given IMEX channels 0 and 9 on a driver of 2048: the denies of every other channel
    are two range blocks, not 2,046 (the kernel's 4,096-instruction limit before 5.2)."""
    rules = [
        ALLOW_ALL,
        *(Rule(allow=False, type=C, major=234, minor=m) for m in range(2048) if m not in (0, 9)),
    ]
    prog = bpf.build_program(rules, None, default_allow=False)
    assert len(prog) // 8 < 40, bpf.disasm(prog)
    opened = [m for m in (*range(2050), (1 << 20) - 1) if bpf_run(prog, C, 234, m, R)]
    assert opened == [0, 9, 2048, 2049, (1 << 20) - 1]
    assert bpf_run(prog, C, 195, 5, RWM) == 1
