"""Generators from a :class:`~netreduce.regmap.types.RegMap`: Markdown reference, driver constants
(a dict, Python module text or a C header) and a JSON-able description for other tools.

Constant names (all upper case):

* ``<TABLE>_BASE``, ``<TABLE>_STRIDE``, ``<TABLE>_COUNT`` for every table;
* ``<TABLE>_<REG>`` = byte address of the register in entry 0 (add ``i * <TABLE>_STRIDE``);
* ``<TABLE>_<REG>_<FIELD>_SHIFT`` / ``_WIDTH`` / ``_MASK`` (mask in register position);
* ``<ENUM>_<MEMBER>`` for the enums (``OP_SUM_SAT``, ``JOBERROR_WINDOW``);
* ``PARAM_<NAME>`` for the build parameters, ``REGMAP_VERSION_MAJOR`` / ``_MINOR``.
"""

from __future__ import annotations

from .types import RegMap

__all__ = ["constants", "python_module", "c_header", "to_markdown", "to_dict"]


def constants(rm: RegMap) -> dict[str, int]:
    """Every address, stride, field position and enum value as a flat name -> int dict."""
    c: dict[str, int] = {
        "REGMAP_VERSION_MAJOR": rm.version[0],
        "REGMAP_VERSION_MINOR": rm.version[1],
        "REGMAP_SIZE": rm.size,
    }
    for k, v in rm.params.items():
        c[f"PARAM_{k.upper()}"] = v
    for t in rm.tables:
        c[f"{t.name}_BASE"] = t.base
        c[f"{t.name}_STRIDE"] = t.stride
        c[f"{t.name}_COUNT"] = t.count
        for r in t.registers:
            p = f"{t.name}_{r.name}"
            c[p] = t.base + r.offset
            if len(r.fields) > 1 or r.fields[0].width != 32:
                for f in r.fields:
                    q = f"{p}_{f.name.upper()}"
                    c[f"{q}_SHIFT"] = f.lsb
                    c[f"{q}_WIDTH"] = f.width
                    c[f"{q}_MASK"] = f.mask
    for e in rm.enums:
        for m in e:
            c[f"{e.__name__.upper()}_{m.name}"] = int(m)
    return c


def python_module(rm: RegMap) -> str:
    """Source text of a standalone Python module holding :func:`constants`."""
    lines = [f'"""Generated from the {rm.name} register map v{rm.version[0]}.{rm.version[1]} '
             '(netreduce.regmap): do not edit."""', ""]
    lines += [f"{k} = 0x{v:X}" for k, v in constants(rm).items()]
    return "\n".join(lines) + "\n"


def c_header(rm: RegMap) -> str:
    """A C header with the same constants (``#define NR_<NAME> 0x...u``)."""
    g = f"NETREDUCE_REGMAP_V{rm.version[0]}_H"
    lines = [f"/* Generated from the {rm.name} register map: do not edit. */",
             f"#ifndef {g}", f"#define {g}", ""]
    lines += [f"#define NR_{k} 0x{v:X}u" for k, v in constants(rm).items()]
    return "\n".join(lines + ["", f"#endif /* {g} */", ""])


def to_dict(rm: RegMap) -> dict:
    """A JSON-serialisable description (for non-Python generators)."""
    return {
        "name": rm.name, "version": list(rm.version), "params": dict(rm.params),
        "enums": {e.__name__: {m.name: int(m) for m in e} for e in rm.enums},
        "tables": [{
            "name": t.name, "base": t.base, "stride": t.stride, "count": t.count, "desc": t.desc,
            "registers": [{
                "name": r.name, "offset": r.offset, "desc": r.desc, "access": r.access,
                "reset": r.reset,
                "fields": [{"name": f.name, "lsb": f.lsb, "width": f.width,
                            "access": f.access.value, "reset": f.reset, "desc": f.desc,
                            "enum": f.enum.__name__ if f.enum else None} for f in r.fields],
            } for r in t.registers],
        } for t in rm.tables],
    }


def _esc(s: str) -> str:
    return s.replace("|", "\\|")


def to_markdown(rm: RegMap) -> str:
    """A Markdown register reference: overview, one section per table, enums."""
    out = [f"# {rm.name} register map v{rm.version[0]}.{rm.version[1]}", ""]
    if rm.desc:
        out += [rm.desc + ".", ""]
    out += ["32-bit registers at byte addresses (AXI4-Lite). Access: RO read-only, RW read-write,"
            " W1C write 1 to clear, WO write-only pulse (reads 0). Unmapped addresses answer "
            "DECERR; reserved bits read 0.", "",
            "Build parameters: " + ", ".join(f"{k} = {v}" for k, v in rm.params.items()) + ".",
            "", "| table | base | stride | entries | contents |", "|---|---|---|---|---|"]
    for t in rm.tables:
        out.append(f"| {t.name} | 0x{t.base:04X} | 0x{t.stride:X} | {t.count} | {_esc(t.desc)} |")
    for t in rm.tables:
        out += ["", f"## {t.name} — {t.desc}", ""]
        if t.count > 1:
            out += [f"{t.count} entries; entry *i* at 0x{t.base:04X} + *i* × 0x{t.stride:X}. "
                    "Offsets below are within an entry.", ""]
        out += ["| offset | register | access | reset | description |", "|---|---|---|---|---|"]
        for r in t.registers:
            off = r.offset if t.count > 1 else t.base + r.offset
            out.append(f"| 0x{off:04X} | {r.name} | {r.access} | 0x{r.reset:X} | "
                       f"{_esc(r.desc)} |")
        multi = [r for r in t.registers if len(r.fields) > 1 or r.fields[0].width != 32]
        if multi:
            out += ["", "Fields:", "", "| register | bits | field | access | reset | description |",
                    "|---|---|---|---|---|---|"]
            for r in multi:
                for f in r.fields:
                    d = f.desc or (r.desc if len(r.fields) == 1 else "")
                    d += f" (enum {f.enum.__name__})" if f.enum else ""
                    out.append(f"| {r.name} | {f.bits} | {f.name} | {f.access.value} | "
                               f"{f.reset} | {_esc(d)} |")
    if rm.enums:
        out += ["", "## Enumerations", ""]
        for e in rm.enums:
            out += [f"**{e.__name__}**: " + ", ".join(f"{m.name} = {int(m)}" for m in e), ""]
    return "\n".join(out).rstrip() + "\n"
