"""A strategy is described once (`stratoflow.config.strategies`): no other code branches on a
strategy's name."""

from __future__ import annotations

import ast
from pathlib import Path

from stratoflow.config import locations
from stratoflow.config.strategies import STRATEGIES

ROOT = locations.PROJECT_ROOT
SEARCHED = ("stratoflow", "tasks", "dags")
DESCRIPTIONS = ROOT / "stratoflow" / "config" / "strategies.py"
# Variables that hold something else spelled like a strategy (a Ray address may be "auto").
NOT_A_STRATEGY = {"address"}


def _names_in(node: ast.expr) -> list[str]:
    """The strategy names an operand spells out (a literal, or a literal collection)."""
    if isinstance(node, ast.Constant) and node.value in STRATEGIES:
        return [node.value]
    if isinstance(node, ast.Tuple | ast.List | ast.Set):
        return [name for element in node.elts for name in _names_in(element)]
    return []


def strategy_name_comparisons(path: Path, root: Path = ROOT) -> list[str]:
    """Every `==`, `!=`, `in`, `not in` or `match` case in `path` against a strategy's name."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        operands: list[ast.expr] = []
        if isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
        elif isinstance(node, ast.MatchValue):
            operands = [node.value]
        if any(isinstance(o, ast.Name) and o.id in NOT_A_STRATEGY for o in operands):
            continue
        for name in (name for operand in operands for name in _names_in(operand)):
            found.append(f"{path.relative_to(root)}:{node.lineno}: {name!r}")
    return found


def test_no_code_compares_a_strategy_name_outside_the_descriptions():
    files = sorted(p for top in SEARCHED for p in (ROOT / top).rglob("*.py") if p != DESCRIPTIONS)
    comparisons = [found for path in files for found in strategy_name_comparisons(path)]
    assert not comparisons, (
        "strategy behaviour keyed by name outside stratoflow/config/strategies.py; describe it "
        "there as data instead:\n" + "\n".join(comparisons)
    )


def test_the_check_finds_each_form_it_forbids(tmp_path):
    sample = tmp_path / "sample.py"
    sample.write_text(
        'if training.strategy == "parameter_server": pass\n'
        'remote = name in ("tpu", "one_device")\n'
        "match name:\n"
        '    case "mirrored": pass\n'
        'fit = training.loop == "fit"\n'
        'ray_default = address == "auto"\n'
    )
    assert strategy_name_comparisons(sample, tmp_path) == [
        "sample.py:1: 'parameter_server'",
        "sample.py:2: 'tpu'",
        "sample.py:2: 'one_device'",
        "sample.py:4: 'mirrored'",
    ]


def plan_of(strategy: str, **settings: object) -> list[tuple[str, str, int, str, bool, bool]]:
    from stratoflow.config.strategies import planned_members
    from stratoflow.config.training import TrainingConfig

    plan = planned_members(TrainingConfig(strategy=strategy, **settings))
    result = [m for m in plan.members if m.name == plan.result_from]
    assert len(result) == 1, f"{plan.result_from} is not one of the members"
    return [
        (m.name, m.job, m.index, m.module.rsplit(".", 1)[1], m.server, m.rejoins)
        for m in plan.members
    ]


def test_a_multi_worker_run_is_its_workers_and_worker_0_reports():
    assert plan_of("multi_worker_mirrored", workers=3) == [
        (f"worker {i}", "worker", i, "worker", False, False) for i in range(3)
    ]


def test_a_parameter_server_run_is_servers_and_a_coordinator_that_reports():
    assert plan_of("parameter_server", workers=2, ps=1) == [
        ("worker 0", "worker", 0, "server", True, True),
        ("worker 1", "worker", 1, "server", True, True),
        ("ps 0", "ps", 0, "server", True, False),
        ("coordinator", "chief", 0, "worker", False, False),
    ]
    # On a standing cluster its servers stand in: only the coordinator is started.
    assert plan_of("parameter_server", workers=2, ps=1, cluster="default") == [
        ("coordinator", "chief", 0, "worker", False, False)
    ]


def test_a_one_process_strategy_is_one_training_process():
    for name, described in STRATEGIES.items():
        if not (described.uses_workers or described.uses_ps):
            assert plan_of(name) == [("training process", "", 0, "worker", False, False)]


def test_every_description_refers_only_to_things_that_exist():
    import dataclasses

    from stratoflow.config.options import LOOPS
    from stratoflow.config.training import TrainingConfig

    settings_names = {field.name for field in dataclasses.fields(TrainingConfig)}
    for name, described in STRATEGIES.items():
        assert described.name == name
        assert set(described.loops) <= set(LOOPS) and "custom" in described.loops, name
        assert set(described.alias_of or ()) <= set(STRATEGIES), name
        assert described.batch_divides_by in settings_names | {None}, name
        for role in described.roles:
            assert isinstance(role.count, int) or role.count in settings_names, name
        plan_of(name, workers=2, ps=1)  # the result member is one of the members
