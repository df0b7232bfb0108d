"""The tests mirror the code (docs/how-to/tests.md): a reader finds a module's tests by its path.

`tests/unit/<package path>/test_<module>.py` tests `<package path>/<module>.py`, or the package
`<package path>/<module>/` as a whole; `test_<module>_<aspect>.py` is one aspect of that module
when its tests fill two files. Test files live under `tests/unit/`, `tests/integration/` and
`tests/deploy/`, or at the top of `tests/` for the checks of the repository as a whole; the
helpers and the programs tests start live in `tests/support/`.
"""

from __future__ import annotations

from pathlib import Path

from stratoflow.config import locations

ROOT = locations.PROJECT_ROOT
TESTS = ROOT / "tests"
UNIT = TESTS / "unit"
TEST_ROOTS = ("unit", "integration", "deploy")
REPOSITORY_WIDE = {"test_docs.py", "test_layers.py", "test_mirror.py"}
NOT_TESTS = {"__init__.py", "conftest.py"}


def python_files(folder: Path, pattern: str = "*.py") -> list[Path]:
    return sorted(path for path in folder.rglob(pattern) if "__pycache__" not in path.parts)


def module_named_by(test_file: Path) -> Path | None:
    """The module or package a unit test file is named after (longest name first), or None."""
    relative = test_file.relative_to(UNIT)
    words = relative.stem.removeprefix("test_").split("_")
    folder = ROOT / relative.parent
    for end in range(len(words), 0, -1):
        name = "_".join(words[:end])
        if (folder / f"{name}.py").is_file() or python_files(folder / name):
            return folder / name
    return None


def test_every_unit_test_file_is_named_after_a_module_that_exists() -> None:
    assert UNIT.is_dir(), "no tests/unit/: unit tests live in a tree that mirrors the packages"
    unnamed = [
        str(path.relative_to(ROOT))
        for path in python_files(UNIT, "test_*.py")
        if module_named_by(path) is None
    ]
    assert not unnamed, (
        "unit test files named after no module (tests/unit/<package path>/test_<module>.py "
        f"tests <package path>/<module>.py): {unnamed}"
    )


def test_test_files_live_only_under_the_allowed_roots() -> None:
    misplaced = []
    for path in python_files(TESTS, "test_*.py"):
        relative = path.relative_to(TESTS)
        top_level = len(relative.parts) == 1
        if (top_level and path.name not in REPOSITORY_WIDE) or (
            not top_level and relative.parts[0] not in TEST_ROOTS
        ):
            misplaced.append(str(path.relative_to(ROOT)))
    assert not misplaced, (
        f"test files outside tests/{{{','.join(TEST_ROOTS)}}}/ (or a repository-wide check "
        f"at the top of tests/: {sorted(REPOSITORY_WIDE)}): {misplaced}"
    )


def test_the_unit_tree_holds_tests_only_and_each_folder_is_a_package() -> None:
    helpers = [
        str(path.relative_to(ROOT))
        for path in python_files(UNIT)
        if path.name not in NOT_TESTS and not path.name.startswith("test_")
    ]
    assert not helpers, f"helpers in the unit tree (they belong in tests/support/): {helpers}"
    # Two test files may share a name in different folders (a module's name repeats across
    # packages), which pytest imports apart only when every folder is a package.
    not_packages = sorted(
        str(folder.relative_to(ROOT))
        for folder in {path.parent for path in python_files(TESTS)}
        if not (folder / "__init__.py").is_file()
    )
    assert not not_packages, f"test folders without __init__.py: {not_packages}"


def test_the_slowest_work_units_named_in_conftest_exist() -> None:
    # `make test` starts these first (tests/conftest.py); a path left behind by a move would
    # silently start a long file last.
    from tests.conftest import ALLOWED_SKIPS, SLOWEST_UNITS_FIRST

    named = [*SLOWEST_UNITS_FIRST, *(test.split("::")[0] for test in ALLOWED_SKIPS)]
    missing = [path for path in named if not (ROOT / path).exists()]
    assert not missing, f"tests/conftest.py names paths that do not exist: {missing}"
