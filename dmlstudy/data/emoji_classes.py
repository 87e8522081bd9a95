"""Matching the icons of the emoji sets into classes, and what is dropped.

An icon's name, lowercased with every character other than a–z and 0–9 removed
(:func:`normalise_name`), identifies the emoji across sets ("grinning-face" and fxemoji's "grinningface").
Names that a set declares to be the same emoji are merged into one class: an alias and its parent
(``json["aliases"]``, e.g. "laptop" → "laptop-computer"), and names that two sets give to the same code
points (``chars.json``, where a set ships one). Each family contributes at most one design per class.

Dropped, and why (the counts of a build are in ``manifest.json``):

* **skin-tone variants** — the same drawing recoloured; a tone class would be learnt from skin colour alone.
  Recognised by the skin-tone modifiers U+1F3FB–1F3FF in a set's code points, else by "skin-tone" in the
  name (fluent-emoji-flat names them "-light" … "-dark", which its code points reveal);
* **flags** (regional-indicator pairs and tag sequences, or names "flag-for-…"/"flag-…" with such code
  points) — a national flag is fixed by its standard, so the nine designs of one flag are nearly the same
  rectangle and the families add no variation; "chequered-flag", "white-flag" or "flag-in-hole" stay;
* **keycaps** (U+20E3, or "keycap" in the name) — a digit in a box, which no family varies;
* **mirrored aliases** (an alias with ``hFlip``/``vFlip``/``rotate``, e.g. fluent-emoji-flat draws
  "backhand-index-pointing-right" as the mirrored left hand) — a copy, not a design;
* **gendered variants of a gender-neutral emoji**: "man-X"/"woman-X" (and "men-"/"women-") when the
  gender-neutral "person-X" (or "X", "people-X") is a class too. Several families draw the neutral emoji as
  one of the gendered ones — noto-v1's "person-frowning" is byte-identical to its "woman-frowning",
  openmoji's "person-wearing-turban" to its "woman-wearing-turban" — so person/man/woman do not name a
  difference the families agree on, and a retrieval of the "right" drawing would be scored wrong. The
  gender-neutral class is kept. Gendered pairs with no neutral class (man-cook / woman-cook,
  man-dancing / woman-dancing) are kept as separate classes: every family draws them apart (hair, beard);
* **ambiguous designs**: a drawing that one family uses for two classes (twemoji draws all family-* emoji
  alike) is removed from every class it appears in;
* **near-identical renders**: two images of one family in two classes whose rendered pixels differ nowhere by
  more than :data:`~dmlstudy.data.emoji_checks.NEAR_DUPLICATE_LEVELS` of 255 levels are both removed, as for an
  ambiguous design (the rule and its threshold: :mod:`dmlstudy.data.emoji_checks`);
* **classes with fewer than** :data:`MIN_DESIGNS` designs left.
"""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from dmlstudy.data.emoji_sources import IconSet

MIN_DESIGNS = 5  # a class needs designs from at least this many families


# ----------------------------------------------------------------------------------------------
# Matching icons across sets into classes
# ----------------------------------------------------------------------------------------------
SKIN_TONE_MODIFIERS = range(0x1F3FB, 0x1F400)
REGIONAL_INDICATORS = range(0x1F1E6, 0x1F200)
TAG_CHARACTERS = range(0xE0020, 0xE0080)
KEYCAP = 0x20E3
GENDER_NEUTRAL = {"man": ("person", ""), "woman": ("person", ""), "men": ("people", ""), "women": ("people", "")}


def normalise_name(name: str) -> str:
    """The cross-set key of an icon name: lowercase, letters and digits only ("Grinning-Face" → "grinningface")."""
    return re.sub(r"[^a-z0-9]", "", name.lower())


def codepoint_exclusion(sequence: str) -> str:
    """Why an emoji given by its code points (``"1f44d-1f3fb"``) is dropped, or "" when it is kept."""
    points = [int(part, 16) for part in sequence.split("-") if part]
    if any(p in SKIN_TONE_MODIFIERS for p in points):
        return "skin tone"
    if any(p in REGIONAL_INDICATORS or p in TAG_CHARACTERS for p in points):
        return "flag"
    if KEYCAP in points:
        return "keycap"
    return ""


def name_exclusion(name: str) -> str:
    """Why an icon is dropped judging by its name alone (sets without code points), or "" when it is kept."""
    if "skin-tone" in name or re.search(r"-tone[1-5](-|$)", name):
        return "skin tone"
    if name.startswith("flag-for-"):
        return "flag"
    if "keycap" in name:
        return "keycap"
    return ""


def neutral_siblings(name: str) -> list[str]:
    """Normalised names of the gender-neutral emoji a gendered "man-X"/"woman-X"/"men-X"/"women-X" is a variant of."""
    first, _, rest = name.partition("-")
    if first not in GENDER_NEUTRAL or not rest:
        return []
    return [normalise_name(f"{neutral}-{rest}" if neutral else rest) for neutral in GENDER_NEUTRAL[first]]


class NameGroups:
    """Union-find over normalised names that refuses a merge two names drawn differently by one family.

    ``drawings[key][family]`` holds the SVG bodies the family shows under ``key``. Two groups are merged
    only when no family has a drawing in both that differ: a set may declare "cricket" the same emoji as
    "cricket-game" while another draws a cricket (the insect) and a cricket game apart, and merging them
    there would put two emoji into one class. The smaller root name wins, so grouping is deterministic for a
    given order of merges.
    """

    def __init__(self, drawings: Mapping[str, Mapping[str, set[str]]]) -> None:
        self.parent: dict[str, str] = {key: key for key in drawings}
        self.drawings: dict[str, dict[str, set[str]]] = {
            key: {family: set(bodies) for family, bodies in by_family.items()} for key, by_family in drawings.items()
        }
        self.refused = 0

    def find(self, key: str) -> str:
        self.parent.setdefault(key, key)
        self.drawings.setdefault(key, {})
        while self.parent[key] != key:
            self.parent[key] = self.parent[self.parent[key]]
            key = self.parent[key]
        return key

    def merge(self, a: str, b: str) -> bool:
        """Put ``a`` and ``b`` into one group unless a family draws them differently; whether they are together."""
        root_a, root_b = sorted((self.find(a), self.find(b)))
        if root_a == root_b:
            return True
        drawings_a, drawings_b = self.drawings[root_a], self.drawings[root_b]
        if any(family in drawings_a and drawings_a[family] != bodies for family, bodies in drawings_b.items()):
            self.refused += 1
            return False
        self.parent[root_b] = root_a
        for family, bodies in self.drawings.pop(root_b).items():
            drawings_a.setdefault(family, set()).update(bodies)
        return True

    def members(self) -> list[list[str]]:
        """The groups, each a sorted list of names, in the order of their smallest name."""
        groups: dict[str, list[str]] = defaultdict(list)
        for key in sorted(self.parent):
            groups[self.find(key)].append(key)
        return list(groups.values())


@dataclass(frozen=True)
class EmojiClass:
    """A matched emoji: its ``name`` (hyphenated, as most sets spell it), the merged normalised ``keys`` and
    ``designs``: family → the icon of that family drawing it."""

    name: str
    keys: tuple[str, ...]
    designs: Mapping[str, str]


def match_classes(
    icon_sets: Sequence[IconSet], *, min_designs: int = MIN_DESIGNS
) -> tuple[list[EmojiClass], dict[str, Any]]:
    """Match the icons of ``icon_sets`` into classes (see the module docstring for every rule).

    Returns the classes sorted by name and what was dropped: counts per reason and the names of the gendered
    variants left out.
    """
    spellings: dict[str, Counter] = defaultdict(Counter)  # key → its hyphenated spellings, one count per family
    icon_families: Counter = Counter()  # key → how many families have an icon (not an alias) of that name
    names_by_family: dict[str, dict[str, list[str]]] = {}  # family → key → the family's names with that key
    drawings: dict[str, dict[str, set[str]]] = defaultdict(dict)  # key → family → the bodies it shows as key
    keys_by_sequence: dict[str, set[str]] = defaultdict(set)  # code points → keys the sets give them
    aliases: list[tuple[str, str, str]] = []  # (family, alias, parent): names a set declares the same emoji
    same_code_points: list[tuple[str, str]] = []  # keys that the sets give the same code points
    excluded: dict[str, str] = {}  # key → why it is dropped
    dropped: Counter = Counter()

    for icon_set in icon_sets:
        names: dict[str, list[str]] = defaultdict(list)
        for name in sorted(icon_set.icons):
            if icon_set.resolve(name) is None:
                dropped["hidden icons"] += 1
                continue
            names[normalise_name(name)].append(name)
            icon_families[normalise_name(name)] += 1
        for name, alias in sorted(icon_set.aliases.items()):
            if icon_set.resolve(name) is None:
                dropped["aliases of hidden icons, mirrored or rotated aliases"] += 1
                continue
            names[normalise_name(name)].append(name)
            aliases.append((icon_set.family, name, alias["parent"]))
        for sequence, name in sorted(icon_set.chars.items()):
            if codepoint_exclusion(sequence):
                excluded.setdefault(normalise_name(name), codepoint_exclusion(sequence))
            keys_by_sequence[sequence.lower().replace("-fe0f", "")].add(normalise_name(name))
        for key, key_names in names.items():
            bodies = {icon_set.icons[icon]["body"] for icon in map(icon_set.resolve, key_names) if icon}
            drawings[key][icon_set.family] = bodies
            for name in key_names:
                spellings[key][name] += 1
                if name_exclusion(name):
                    excluded.setdefault(key, name_exclusion(name))
        names_by_family[icon_set.family] = dict(names)
    for keys in keys_by_sequence.values():
        first, *others = sorted(keys)
        same_code_points += [(first, key) for key in others]

    groups = NameGroups(drawings)
    for family, alias, parent in aliases:
        if not groups.merge(normalise_name(alias), normalise_name(parent)):
            names_by_family[family][normalise_name(alias)].remove(alias)  # its drawing belongs to the parent
    for key, other in same_code_points:
        groups.merge(key, other)
    dropped["name links refused (drawn apart by a family)"] = groups.refused

    by_family = icon_sets_by_family(icon_sets)
    candidates: list[EmojiClass] = []
    for keys in groups.members():
        reasons = sorted({excluded[k] for k in keys if k in excluded})
        if reasons:
            dropped[f"{reasons[0]} emoji"] += 1
            continue
        ranked = sorted(keys, key=lambda k: (-icon_families[k], len(k), k))
        designs = {}
        for family, names in names_by_family.items():
            icons = [by_family[family].resolve(name) for key in ranked for name in names.get(key, [])]
            icons = [icon for icon in icons if icon]
            if icons:
                designs[family] = icons[0]
        spelling = min(spellings[ranked[0]].items(), key=lambda item: (-item[1], -item[0].count("-"), item[0]))[0]
        candidates.append(EmojiClass(name=spelling, keys=tuple(ranked), designs=designs))

    # a drawing that one family uses for two classes shows neither of them
    body = {(c.name, f): by_family[f].icons[icon]["body"] for c in candidates for f, icon in c.designs.items()}
    usage = Counter((family, drawing) for (_, family), drawing in body.items())
    ambiguous = {(name, family) for (name, family), drawing in body.items() if usage[family, drawing] > 1}
    dropped["ambiguous designs"] = len(ambiguous)
    candidates = [
        EmojiClass(c.name, c.keys, {f: icon for f, icon in c.designs.items() if (c.name, f) not in ambiguous})
        for c in candidates
    ]
    kept = [c for c in candidates if len(c.designs) >= min_designs]
    dropped[f"emoji with fewer than {min_designs} designs"] = len(candidates) - len(kept)

    kept_keys = {key for c in kept for key in c.keys}
    gendered = [c for c in kept if any(key in kept_keys for key in neutral_siblings(c.name))]
    dropped["gendered variants of a gender-neutral class"] = len(gendered)
    classes = sorted((c for c in kept if c not in gendered), key=lambda c: c.name)
    return classes, {"counts": dict(sorted(dropped.items())), "gendered_variants": sorted(c.name for c in gendered)}


def icon_sets_by_family(icon_sets: Iterable[IconSet]) -> dict[str, IconSet]:
    return {icon_set.family: icon_set for icon_set in icon_sets}
