"""The exercises: each one's checks, maximum and time budget, and which exercise a handed-in notebook is.

An exercise is defined once, in its module of `minigrpo.grading.checks`, beside the checks it owns::

    EXERCISE = exercise("04_group_relative_advantages", [check_group_relative_advantages, check_rloo_advantages],
                        solution_seconds=12)

Its checks and their points are the exercise's, not the submission's: a check whose cell a learner deleted scores
0 of its points, a check pasted from another exercise is ignored, and an empty or unreadable notebook scores 0 of
the exercise's maximum. `solution_seconds` is how long grading the exercise's solution takes (a kernel started, every
cell run, every check judged) on a 2-core CPU grading two notebooks at once; a notebook of that exercise may run for
`time_limit` = TIME_LIMIT_FACTOR times that before the grader stops it.

Which exercise a notebook is
----------------------------
`scripts/make_exercises.py` stamps every exercise and solution notebook's metadata with its exercise and the
package's version (`Exercise.stamp`)::

    "metadata": {"minigrpo": {"exercise": "04_group_relative_advantages", "version": "0.3.0", "revision": 1,
                              "checks": {"check_group_relative_advantages": 4, "check_rloo_advantages": 2}}}

`identify` reads, in order: that stamp (a renamed copy, "Copy of 04_...ipynb" or "04_... (1).ipynb", keeps it);
the file name (an exercise's id in it, or its number first: "04_mine.ipynb"); the checks the notebook calls, when
they all belong to one exercise. A notebook that none of these names is graded on the checks it calls, and stays
out of the gradebook. A stamp whose exercise is not an id (a list, a number) is not the one make_exercises writes:
it is ignored, with a note, as a stamp of an exercise this version does not have is.

A stamp from another version of the package is the handout of that version. When the exercise's checks (their names
and points) and its `revision` are the same in both, it is graded, with a warning that names both versions; when
they changed, it is refused (0 points, and the reason, which names each check whose points differ, is new or is gone,
and the revision): grade it with the version that made it. A stamp of this very version whose exercise differs comes
from another copy of it (a checkout whose exercise changed since): the refusal says so, and to grade it with that
copy or hand out this one's exercise. `revision` is raised by hand when what the learner writes changes without a
check's name or points changing (a function's arguments or meaning).

Renumbered exercises
--------------------
Since minigrpo 0.3.0 the exercises are numbered in the order the lessons reach them; an exercise that had another
number says so (`formerly="02_group_relative_advantages"`). A notebook stamped or named with the former id is that
exercise, graded under its new id with a one-line note, and the version contract above still decides whether its
checks are the same. Gradescope's `--exercise` takes a former id too (an autograder made before the renumbering).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import PurePath

from minigrpo.grading.framework import CASES, format_points, max_points

TIME_LIMIT_FACTOR = 3
"""A notebook may run this many times as long as its exercise's solution takes to grade."""
METADATA_KEY = "minigrpo"
"""The key of a notebook's metadata that holds its exercise's stamp."""


@dataclass(frozen=True)
class Exercise:
    """One exercise: its id (its notebook's file stem), the checks it owns in order, and its time budget.

    solution_seconds: grading its solution on a 2-core CPU, two notebooks at once (kernel, cells, judge).
    revision: raised when what the learner writes changes while the checks' names and points stay the same.
    formerly: its id before the exercises were numbered in the course's order (minigrpo 0.3.0), if it had another.
    """

    id: str
    checks: tuple[str, ...]
    solution_seconds: float
    revision: int = 1
    formerly: str | None = None

    @property
    def number(self) -> str:
        """'04' of '04_group_relative_advantages'."""
        return self.id.split("_", 1)[0]

    @property
    def max_points(self) -> float:
        return sum(max_points(name) for name in self.checks)

    @property
    def time_limit(self) -> int:
        """Seconds a notebook of this exercise may run (its cells and the judging of its checks): 3x its solution's."""
        return math.floor(TIME_LIMIT_FACTOR * self.solution_seconds)

    def check_maxima(self) -> dict[str, float]:
        return {name: max_points(name) for name in self.checks}

    def stamp(self, version: str) -> dict:
        """What make_exercises writes into the notebook's metadata[METADATA_KEY]."""
        return {"exercise": self.id, "version": version, "revision": self.revision, "checks": self.check_maxima()}


EXERCISES: dict[str, Exercise] = {}
"""exercise id -> its definition (registered as the check modules are imported: sort the ids for the course's
order)."""


def exercise(
    id: str, checks: Sequence[Callable | str], solution_seconds: float, revision: int = 1, formerly: str | None = None
) -> Exercise:
    """Register an exercise and the checks it owns (check functions or their names); each check has one exercise.

    formerly: the exercise's id before the renumbering in the course's order, when it had another."""
    names = tuple(c if isinstance(c, str) else c.__name__ for c in checks)
    for an_id in (id, formerly or id):
        if not re.fullmatch(r"\d{2}_\w+", an_id):
            raise ValueError(f"exercise id {an_id!r}: use its notebook's file stem, two digits first (04_group_...).")
    if formerly is not None and (formerly == id or renamed(formerly) is not None):
        raise ValueError(f"exercise {id}: formerly={formerly!r} is its own id or another exercise's former id.")
    for name in names:
        if name not in CASES:
            raise ValueError(f"exercise {id}: {name} has no cases (@cases({name!r}) registers them).")
        if owner(name) is not None:
            raise ValueError(f"exercise {id}: {name} belongs to exercise {owner(name).id} already.")
    if id in EXERCISES or solution_seconds <= 0:
        raise ValueError(f"exercise {id}: registered twice, or solution_seconds {solution_seconds} is not positive.")
    EXERCISES[id] = Exercise(id, names, float(solution_seconds), revision, formerly)
    return EXERCISES[id]


def renamed(former_id: str) -> Exercise | None:
    """The exercise whose id was `former_id` before the renumbering (None when no exercise had that id)."""
    return next((e for e in EXERCISES.values() if e.formerly == former_id), None)


def owner(check: str) -> Exercise | None:
    """The exercise a check belongs to (None for a check of no exercise)."""
    return next((e for e in EXERCISES.values() if check in e.checks), None)


# --- which exercise a notebook is -----------------------------------------------------------------------
@dataclass
class Identity:
    """Which exercise a notebook is, how that was found, and what the grader says about it.

    by: "metadata" | "file name" | "checks" (those it calls) | "" (none: graded on the checks it calls).
    refusal: set when the notebook is another version's handout whose checks changed: it earns 0, with this reason.
    """

    exercise: Exercise | None
    by: str = ""
    version: str | None = None  # the package version stamped in its metadata
    warnings: list[str] = field(default_factory=list)
    refusal: str | None = None


_COPY_PREFIX = re.compile(r"^(copy of |copia de |kopie van )+", re.IGNORECASE)
_COPY_SUFFIX = re.compile(r"(\s*\(\d+\)|-Copy\d*|\s+copy\s*\d*)+$", re.IGNORECASE)


def from_file_name(path: str | PurePath) -> Exercise | None:
    """The exercise a file name names: its id inside the name, or its number first ('04_mine', 'Copy of 04_x (1)')."""
    stem = _COPY_SUFFIX.sub("", _COPY_PREFIX.sub("", PurePath(path).stem.strip()))
    lowered = stem.lower()
    for candidate in EXERCISES.values():
        if candidate.id in lowered:
            return candidate
    for candidate in EXERCISES.values():  # a notebook handed out before the renumbering
        if candidate.formerly is not None and candidate.formerly in lowered:
            return candidate
    number = re.match(r"(\d{2})(?!\d)", stem)
    return next((e for e in EXERCISES.values() if number and e.number == number.group(1)), None)


def from_checks(called: Sequence[str]) -> Exercise | None:
    """The one exercise all of `called` (check names) belong to; None when they span several, or none."""
    owners = {owner(name) for name in called}
    return owners.pop() if len(owners) == 1 and None not in owners else None


def identify(metadata, path: str | PurePath, called: Sequence[str], version: str) -> Identity:
    """Which exercise a notebook is: its metadata's stamp, else its file name, else the checks it calls.

    metadata: the notebook's metadata (a dict; None when it could not be read); called: the checks its code calls;
    version: the grader's package version.
    """
    stamp = metadata.get(METADATA_KEY) if isinstance(metadata, dict) else None
    stamped = stamp.get("exercise") if isinstance(stamp, dict) else None
    named = from_file_name(path)
    if isinstance(stamped, str) and (stamped in EXERCISES or renamed(stamped) is not None):
        exercise_ = EXERCISES.get(stamped) or renamed(stamped)
        identity = Identity(exercise_, "metadata", str(stamp.get("version") or "") or None)
        if exercise_.id != stamped:
            identity.warnings.append(renumbered(stamped, exercise_))
        if named is not None and named is not identity.exercise:
            identity.warnings.append(
                f"its file name says exercise {named.id} but its metadata says {identity.exercise.id}: "
                f"graded as {identity.exercise.id}"
            )
        _version_contract(identity, stamp, version)
        return identity
    warnings = []
    if isinstance(stamped, str):
        warnings.append(f"its metadata names exercise {stamped[:100]!r}, which minigrpo {version} does not have")
    elif stamp is not None:  # a list, say, where make_exercises writes an exercise's id
        warnings.append(
            "its metadata's stamp names no exercise's id (it is not the stamp scripts/make_exercises.py writes): "
            "ignored"
        )
    if named is not None:
        name = PurePath(path).name.lower()
        if named.formerly is not None and named.id not in name and named.formerly in name:
            warnings.append(renumbered(named.formerly, named))
        return Identity(named, "file name", warnings=warnings)
    by_checks = from_checks(called)
    if by_checks is not None:
        return Identity(by_checks, "checks", warnings=warnings)
    warnings.append(
        "not identified as an exercise (no stamp in its metadata, no exercise's name in its file name, and its checks "
        "belong to several exercises or none): graded on the checks it calls, and left out of the gradebook"
    )
    return Identity(None, warnings=warnings)


def renumbered(former_id: str, exercise_: Exercise) -> str:
    """The one-line note on a notebook of an exercise under its former id."""
    return (
        f"exercise {former_id} is exercise {exercise_.id} since the exercises were numbered in the course's order "
        f"(minigrpo 0.3.0): graded as {exercise_.id}"
    )


def _version_contract(identity: Identity, stamp: dict, version: str) -> None:
    """Warn about, or refuse, a handout whose stamp is not this version's (see the module's docstring)."""
    exercise_ = identity.exercise
    theirs = identity.version or "an unknown version"
    same_checks = _stamped_checks(stamp) == exercise_.check_maxima() and stamp.get("revision") == exercise_.revision
    if same_checks and identity.version == version:
        return
    if same_checks:
        identity.warnings.append(
            f"handed out with minigrpo {theirs}, graded with minigrpo {version}: exercise {exercise_.id}'s checks "
            "are the same in both"
        )
        return
    differences = "; ".join(_differences(stamp, exercise_))
    if identity.version == version:  # a copy of this version whose exercise changed (a checkout's, say)
        identity.refusal = (
            f"handed out with minigrpo {version}, this very version, but another copy of it, whose exercise "
            f"{exercise_.id} differs from this copy's ({differences}): grade it with the copy of minigrpo {version} "
            "that made the handout, or hand out this copy's exercise (python scripts/make_exercises.py writes it)"
        )
        return
    if identity.version:
        made_by = grade_with = f"minigrpo {identity.version}"
    else:
        made_by, grade_with = "a minigrpo that stamped no version", "the minigrpo that made the handout"
    identity.refusal = (
        f"handed out with {made_by}, whose exercise {exercise_.id} differs from minigrpo {version}'s ({differences}): "
        f"grade it with {grade_with}, or hand out minigrpo {version}'s exercise"
    )


_SHOWN_DIFFERENCES = 5
"""A refusal lists this many differences at most (a stamp is the learner's file: it may list thousands)."""


def _differences(stamp: dict, exercise_: Exercise) -> list[str]:
    """What differs between a handout's stamp and `exercise_`: each check whose points differ, is new or is gone, then
    the revision. What the stamp holds is shown as data (quoted, cut short)."""
    ours, theirs = exercise_.check_maxima(), _stamped_checks(stamp)
    found = [] if theirs is not None else ["the handout's stamp lists no checks"]
    theirs = theirs or {}
    for name, points in ours.items():
        if name not in theirs:
            found.append(f"{name}: not in the handout")
        elif theirs[name] != points:
            found.append(f"{name}: {format_points(points)} points here, {_shown(theirs[name])} in the handout")
    found += [f"{_shown(name)}: in the handout only" for name in theirs if name not in ours]
    if stamp.get("revision") != exercise_.revision:
        found.append(
            f"revision {_shown(stamp.get('revision'))} in the handout, {exercise_.revision} here: what the learner "
            "writes changed"
        )
    more = len(found) - _SHOWN_DIFFERENCES
    return found[:_SHOWN_DIFFERENCES] + ([f"{more} more"] if more > 0 else [])


def _shown(value) -> str:
    """A value of a stamp as the refusal shows it: a number as it is, anything else quoted, cut at 40 characters."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return format_points(value)
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _stamped_checks(stamp: dict) -> dict | None:
    checks = stamp.get("checks")
    return dict(checks) if isinstance(checks, dict) else None
