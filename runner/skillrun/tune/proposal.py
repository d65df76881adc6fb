"""The card change a tuning win proposes: a new recipe for the tuned shape, as a SKILL.md diff.

The recipe is inserted as text just before the recipe the plan selects today (the default, for an
untuned shape), so the rest of the card keeps its formatting and comments and the diff shows only
the new recipe and one new ``tests.selects`` case (which makes lint hold the card to it). The new
card is parsed, schema-checked, linted and its selection for the shape re-checked before it is
offered, and again before ``--apply`` replaces the file (atomically).
"""
from __future__ import annotations

import difflib
import os
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from skillrun.errors import SkillRunError
from skillrun.kb import tunable as T
from skillrun.kb.cards import SkillCard, problem_keys, read_skill
from skillrun.kb.index import SkillIndex
from skillrun.plan.select import select_recipe


def recipe_name_for(card: SkillCard, shape: dict[str, int]) -> str:
    base = "tuned_" + "_".join(f"{k.lower()}{v}" for k, v in shape.items())
    base = re.sub(r"[^a-z0-9_]", "_", base)[:90]
    names = {r.name for r in card.recipes}
    name, n = base, 2
    while name in names:
        name, n = f"{base}_v{n}", n + 1
    return name


def _split(text: str) -> tuple[str, str, str]:
    if not text.startswith("---\n"):
        raise SkillRunError("card does not start with a YAML front matter block", field="(front matter)")
    end = text.find("\n---\n", 4)
    if end < 0:
        raise SkillRunError("card front matter is not closed by ---", field="(front matter)")
    return text[:4], text[4:end + 1], text[end + 1:]


def _dump_item(d: dict[str, Any], indent: str) -> str:
    body = yaml.safe_dump([d], sort_keys=False, default_flow_style=None, width=180, allow_unicode=True)
    return "".join(indent + ln + "\n" for ln in body.splitlines())


def _new_recipe(card: SkillCard, rec: dict[str, Any], name: str, artifact: str) -> dict[str, Any]:
    dec = rec["decision"]
    cid = dec["winner"]
    by_id = {c["id"]: c for c in rec["candidates"]}
    win = by_id[cid]
    start_name = rec["recipe"]["why"].split("sweep starts from ")[-1].split(":")[0]
    start = T.raw_recipe(card, start_name)
    shape = rec["shape"]
    noise = dec["noise_pct"]
    ses = rec["recheck"]
    loses = [f"incumbent recipe {rec['recipe']['name']}: this recipe is {dec['speedup_vs_incumbent']:.3f}x faster in the same "
             f"re-check session (A/A noise {noise:.2f}%)"]
    for other in ses["slots"]:
        if other in (cid, "incumbent", "baseline") or other not in by_id or by_id[other]["config"] in (win["config"], rec["recipe"]["config"]):
            continue
        sp = ses["ratio_vs_incumbent"].get(other)
        if sp:
            loses.append(f"{by_id[other]['label']}: {sp:.3f}x of the incumbent (this recipe {dec['speedup_vs_incumbent']:.3f}x), same session")
    gpu = rec["device"].get("name", "?")
    commit = rec["runner"].get("git_revision", "unknown")[:12]
    ev: dict[str, Any] = {"shape": dict(shape), "gpu": gpu,
                          "source": f"skill-run tune, {gpu}, commit {commit} ({artifact})"}
    if dec.get("speedup_vs_baseline"):
        ev["speedup"] = float(dec["speedup_vs_baseline"])
        ev["versus"] = "the card's baseline, same re-check session"
    else:
        ev["speedup"] = float(dec["speedup_vs_incumbent"])
        ev["versus"] = f"incumbent recipe {rec['recipe']['name']}, same re-check session (baseline not timed)"
    med = (ses["stats"].get(cid) or {}).get("median")
    if med is not None:
        ev["note"] = f"median {med:.6g} ms over {ses['stats'][cid].get('samples')} interleaved rounds; {rec['timing']['method']}"
    new: dict[str, Any] = {
        "name": name,
        "when": " and ".join(f"{k} == {v}" for k, v in shape.items()),
    }
    if start.get("gens"):
        new["gens"] = list(start["gens"])
    # A winner from the recipe's tunable_kernels carries its own kernel and backend (tune/sweep.py).
    new.update(kernel=win.get("kernel") or start["kernel"], backend=win.get("backend") or start["backend"], config=dict(win["config"]),
               lever=f"tuned by skill-run tune for this exact shape from {start_name}: {win['label']} "
                     f"({dec['speedup_vs_incumbent']:.3f}x the incumbent, A/A noise {noise:.2f}%); not yet generalised to a shape class",
               loses=loses)
    if dec.get("speedup_vs_baseline"):
        new["expected_speedup"] = float(dec["speedup_vs_baseline"])
    new["evidence"] = [ev]
    if win.get("kernel") and win["kernel"] != start["kernel"]:
        # The space the winner came from becomes the new recipe's own space.
        src = next((t for t in start.get("tunable_kernels") or [] if t["kernel"] == win["kernel"]), None)
        if src:
            new["tunable"] = {k: src[k] for k in ("space", "constraints", "max_candidates") if k in src}
    elif start.get("tunable"):
        new["tunable"] = start["tunable"]
    return new


def _insert_recipe(fm: str, before: str, block: str) -> str:
    m = re.search(rf"^([ \t]*)- name: ['\"]?{re.escape(before)}['\"]?[ \t]*$", fm, flags=re.M)
    if not m:
        raise SkillRunError(f"cannot find recipe {before!r} as a `- name:` line in the front matter", field="recipes")
    return fm[:m.start()] + _reindent(block, m.group(1)) + fm[m.start():]


def _reindent(block: str, indent: str) -> str:
    return "".join(indent + ln + "\n" for ln in block.splitlines())


def _insert_select(fm: str, case: str, shape: dict[str, int], keys: tuple[str, ...]) -> str:
    """Add the new ``tests.selects`` case; an existing case for the same shape (e.g. one that pinned it
    as untuned) is replaced in place, so the diff shows the changed expectation."""
    m = re.search(r"^([ \t]*)selects:[ \t]*(\[\])?[ \t]*$", fm, flags=re.M)
    if not m:
        raise SkillRunError("cannot find `selects:` under `tests:` in the front matter", field="tests.selects")
    indent = m.group(1)
    if m.group(2):  # "selects: []"
        return fm[:m.start()] + f"{indent}selects:\n{indent}  - {case}" + fm[m.end():]
    # The block: lines more indented than `selects:`, or list items at its level.
    pos = m.end()
    item_indent = None
    for ln in fm[m.end():].split("\n")[1:]:
        stripped = ln.lstrip(" ")
        lead = len(ln) - len(stripped)
        if not stripped or not (lead > len(indent) or (lead == len(indent) and stripped.startswith("- "))):
            break
        if stripped.startswith("- "):
            item_indent = item_indent if item_indent is not None else " " * lead
            if _same_shape(stripped[2:], shape, keys):
                start = pos + 1
                return fm[:start] + f"{' ' * lead}- {case}" + fm[start + len(ln):]
        pos += len(ln) + 1
    item_indent = item_indent if item_indent is not None else indent + "  "
    return fm[:pos] + f"\n{item_indent}- {case}" + fm[pos:]


def _same_shape(item_text: str, shape: dict[str, int], keys: tuple[str, ...]) -> bool:
    try:
        item = yaml.safe_load(item_text)
    except yaml.YAMLError:
        return False
    s = item.get("shape") if isinstance(item, dict) else None
    if isinstance(s, list) and len(s) == len(keys):
        s = dict(zip(keys, s))
    return isinstance(s, dict) and {k: int(v) for k, v in s.items()} == {k: int(v) for k, v in shape.items()}


@dataclass
class Proposal:
    old_text: str
    new_text: str
    recipe_name: str


def propose(index: SkillIndex, card: SkillCard, rec: dict[str, Any], artifact: str, facts: dict[str, Any],
            arch: str | None) -> Proposal:
    """The new SKILL.md text, checked: parses, schema-valid, lint-clean, selects the new recipe for the shape."""
    text = Path(card.path).read_text(encoding="utf-8")
    head, fm, body = _split(text)
    name = recipe_name_for(card, rec["shape"])
    block = _dump_item(_new_recipe(card, rec, name, artifact), "")
    fm2 = _insert_recipe(fm, rec["recipe"]["name"], block)
    shape_flow = yaml.safe_dump(dict(rec["shape"]), default_flow_style=True, width=1000, sort_keys=False).strip()
    fm2 = _insert_select(fm2, f"{{shape: {shape_flow}, recipe: {name}}}", rec["shape"], problem_keys(card))
    new_text = head + fm2 + body
    check(index, card, new_text, rec["shape"], facts, arch, name)
    return Proposal(old_text=text, new_text=new_text, recipe_name=name)


def check(index: SkillIndex, card: SkillCard, new_text: str, shape: dict[str, int], facts: dict[str, Any],
          arch: str | None, name: str) -> SkillCard:
    """Parse + schema + lint + selection of ``new_text`` as this card; raises with the first problem."""
    from skillrun.lint import lint_card

    folder = Path(card.path).parent
    fd, tmp = tempfile.mkstemp(prefix=".SKILL.md.tune-", suffix=".md", dir=folder)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(new_text)
        new_card, errs = read_skill(Path(tmp))
        if errs or new_card is None:
            raise SkillRunError("the proposed card does not parse or match the schema: " + "; ".join(str(e) for e in errs)[:800],
                                path=str(card.path))
        errs = lint_card(new_card, index)
        if errs:
            raise SkillRunError("the proposed card fails lint: " + "; ".join(str(e).replace(tmp, str(card.path)) for e in errs)[:800],
                                path=str(card.path))
        sel = select_recipe(new_card, shape, facts, arch)
        if sel.recipe.name != name:
            raise SkillRunError(f"the proposed card selects {sel.recipe.name!r} for {shape}, not the new recipe {name!r}",
                                path=str(card.path))
        return new_card
    finally:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass


def unified_diff(card: SkillCard, prop: Proposal) -> str:
    rel = f"skills/{Path(card.path).parent.name}/SKILL.md"
    return "".join(difflib.unified_diff(prop.old_text.splitlines(True), prop.new_text.splitlines(True),
                                        fromfile=f"a/{rel}", tofile=f"b/{rel}"))


def apply(index: SkillIndex, card: SkillCard, prop: Proposal, shape: dict[str, int], facts: dict[str, Any],
          arch: str | None) -> Path:
    """Re-check, then replace SKILL.md atomically (a temp file in the same folder, fsync, rename)."""
    if Path(card.path).read_text(encoding="utf-8") != prop.old_text:
        raise SkillRunError("the card changed on disk while tuning; nothing applied, re-run tune", path=str(card.path))
    check(index, card, prop.new_text, shape, facts, arch, prop.recipe_name)
    folder = Path(card.path).parent
    fd, tmp = tempfile.mkstemp(prefix=".SKILL.md.apply-", suffix=".md", dir=folder)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(prop.new_text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, card.path)
    finally:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
    return Path(card.path)
