"""Who owns a pipeline's MLflow names: its experiment and its registered model.

MLflow's basic-auth app lets every signed-in user create experiments and registered models, and
makes the creator the one user besides the admins who may write to them (MANAGE). Whoever
creates `stratoflow/<pipeline>` or the spec's `registered_model` first owns the name: if that is
not the account the pipeline's runs log as, they can neither log nor register. So the names are
claimed for that account before anyone else can take them: every start of a deployment claims
every discovered pipeline's names (`stratoflow.services.mlflow_auth`), and each retrain's first
task claims what is still free and refuses to run, without retry, under a name someone else
owns (`claim_pipeline_names`).

Everything here goes through MLflow's REST API as the account itself: it may find, create and
read experiments and registered models, and ask for its own permission on them
(`/api/3.0/mlflow/users/permissions/get`), but MLflow tells only admins who else holds one.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from typing import Any

from stratoflow.config import locations, names
from stratoflow.config.parsing import SpecError
from stratoflow.config.spec import PipelineSpec

logger = logging.getLogger(__name__)

EXPERIMENT = "experiment"
REGISTERED_MODEL = "registered_model"
# The runs write to both, and a failed run deletes its model versions and aliases: MANAGE.
NEEDED_PERMISSION = "MANAGE"
PERMISSION_PATH = "/api/3.0/mlflow/users/permissions/get"
GRANT_PATH = "/api/3.0/mlflow/users/permissions/grant"
CURRENT_USER_PATH = "/api/2.0/mlflow/users/current"

# What a claim found.
CREATED = "created"  # the account created it: MLflow made it its manager
HELD = "held"  # it existed, and the account holds MANAGE on it
GRANTED = "granted"  # it existed without an owner; an admin granted the account MANAGE
UNCHECKED = "unchecked"  # the server does not sign in: nobody owns anything
TAKEN = "taken"  # another user owns it
DELETED = "deleted"  # a deleted experiment keeps its name until `mlflow gc`
USABLE = frozenset({CREATED, HELD, GRANTED, UNCHECKED})

# A call of MLflow's REST API: (method, path, query or JSON body) -> (HTTP status, JSON answer).
Rest = Callable[[str, str, dict[str, Any]], tuple[int, dict[str, Any]]]


class ClaimError(RuntimeError):
    """MLflow answered a claim in a way it should not (the message has its answer)."""


class NameOwnedError(SpecError):
    """A pipeline's experiment or registered model belongs to another MLflow user.

    A refusal like an invalid spec: every retry would get the same answer until an admin acts,
    so the task fails at once, without retry.
    """


@dataclass(frozen=True)
class NameClaim:
    """One MLflow name of a pipeline, as the account that logs its runs found it.

    Attributes:
        kind: `experiment` or `registered_model` (MLflow's resource types).
        name: the experiment's or registered model's name.
        resource_id: what MLflow's permissions name it by: the experiment id, the model's name.
        outcome: `created`, `held`, `granted`, `unchecked` (usable), `taken` or `deleted`.
        account: the MLflow user the claim was made as ("" on a server without sign-in).
        permission: the account's permission on it, when the server signs in.
        owners: the users holding MANAGE on it, when an admin looked; None when unknown.
    """

    kind: str
    name: str
    resource_id: str
    outcome: str
    account: str = ""
    permission: str | None = None
    owners: tuple[str, ...] | None = None

    @property
    def usable(self) -> bool:
        """Whether the account's runs can log and register under this name."""
        return self.outcome in USABLE

    @property
    def label(self) -> str:
        kind = "experiment" if self.kind == EXPERIMENT else "registered model"
        return f"MLflow {kind} {self.name!r}"

    def describe(self) -> str:
        """One line: the name and what the claim found (with the fix when it is unusable)."""
        if not self.usable:
            return self.problem()
        what = {
            CREATED: f"created for {self.account}",
            HELD: f"held by {self.account} (MANAGE)",
            GRANTED: f"had no owner: MANAGE granted to {self.account}",
            UNCHECKED: "present (the server does not sign in: no owners)",
        }[self.outcome]
        return f"{self.label}: {what}"

    def problem(self) -> str:
        """What is wrong with the name and how an admin fixes it (one line)."""
        if self.outcome == DELETED:
            return (
                f"{self.label} is deleted, and MLflow keeps a deleted experiment's name until "
                f"`mlflow gc` removes it for good. Fix: an MLflow admin restores it (POST "
                f'/api/2.0/mlflow/experiments/restore {{"experiment_id": "{self.resource_id}"}}) '
                "or removes it with `mlflow gc`"
            )
        owner = (
            f"owned by {', '.join(self.owners)}"
            if self.owners
            else "owned by another MLflow user (MLflow names owners to admins only: the "
            "deployment's start-up log names them)"
        )
        removal = (
            "renames it"
            if self.kind == EXPERIMENT
            else "deletes or renames it (or the pipeline names another `registered_model`)"
        )
        grant = (
            f'{{"username": "{self.account}", "resource_type": "{self.kind}", '
            f'"resource_id": "{self.resource_id}", "permission": "{NEEDED_PERMISSION}"}}'
        )
        return (
            f"{self.label} is {owner}: {self.account}, the account the pipeline's runs log as, "
            f"holds {self.permission or 'no permission'} on it and needs {NEEDED_PERMISSION}. "
            f"Fix: an MLflow admin grants {self.account} {NEEDED_PERMISSION} on it (POST "
            f"{GRANT_PATH} {grant}), or {removal} so that the next start or run creates it "
            f"for {self.account}"
        )


def pipeline_names(spec: PipelineSpec, *, registered_model: bool = True) -> list[tuple[str, str]]:
    """The (kind, name) pairs a pipeline's runs use: its experiment, its registered model."""
    claimed = [(EXPERIMENT, names.experiment_name(spec.name))]
    return claimed + ([(REGISTERED_MODEL, spec.registered_model)] if registered_model else [])


def claim_names(rest: Rest, wanted: Iterable[tuple[str, str]]) -> list[NameClaim]:
    """Find or create each (kind, name) as the account `rest` signs in as; check it holds MANAGE.

    Args:
        rest: MLflow's REST API, signed in as the account.
        wanted: (kind, name) pairs, `pipeline_names` of one or more pipelines.

    Returns:
        One claim per pair, in order.

    Raises:
        ClaimError: MLflow refused a lookup or a creation (e.g. wrong credentials).
    """
    status, answer = rest("GET", CURRENT_USER_PATH, {})
    if status == 404:  # no basic-auth app: no users, no owners
        account, is_admin = "", False
    else:
        expect(status, answer, "who is signed in")
        account, is_admin = str(answer["user"]["username"]), bool(answer["user"]["is_admin"])
    claims = []
    for kind, name in wanted:
        resource_id, created, deleted = _find_or_create(rest, kind, name)
        claim = NameClaim(kind, name, resource_id, CREATED if created else HELD, account)
        if deleted:
            claim = replace(claim, outcome=DELETED)
        elif not account:
            claim = replace(claim, outcome=UNCHECKED)
        elif created or is_admin:
            claim = replace(claim, permission=NEEDED_PERMISSION)
        else:
            permission = own_permission(rest, account, kind, resource_id)
            outcome = HELD if permission == NEEDED_PERMISSION else TAKEN
            claim = replace(claim, outcome=outcome, permission=permission)
        claims.append(claim)
    return claims


def own_permission(rest: Rest, username: str, kind: str, resource_id: str) -> str:
    """`username`'s effective permission on one experiment (by id) or registered model."""
    status, answer = rest(
        "GET",
        PERMISSION_PATH,
        {"username": username, "resource_type": kind, "resource_id": resource_id},
    )
    expect(status, answer, f"the permission of {username} on {kind} {resource_id}")
    return str(answer["permission"])


def _find_or_create(rest: Rest, kind: str, name: str) -> tuple[str, bool, bool]:
    """(resource id, created now, deleted) of the experiment or registered model `name`."""
    if kind == EXPERIMENT:
        lookup = ("/api/2.0/mlflow/experiments/get-by-name", {"experiment_name": name})
        create = "/api/2.0/mlflow/experiments/create"
    else:
        lookup = ("/api/2.0/mlflow/registered-models/get", {"name": name})
        create = "/api/2.0/mlflow/registered-models/create"
    for _ in range(2):  # a creation that lost a race finds the winner's
        status, answer = rest("GET", *lookup)
        if status == 200:
            if kind == EXPERIMENT:
                experiment = answer["experiment"]
                deleted = experiment.get("lifecycle_stage") == "deleted"
                return str(experiment["experiment_id"]), False, deleted
            return name, False, False
        if status != 404:
            expect(status, answer, f"looking up {kind} {name!r}")
        status, answer = rest("POST", create, {"name": name})
        if status == 200:
            return (str(answer["experiment_id"]) if kind == EXPERIMENT else name), True, False
        if answer.get("error_code") != "RESOURCE_ALREADY_EXISTS":
            expect(status, answer, f"creating {kind} {name!r}")
    raise ClaimError(f"MLflow {kind} {name!r} is neither found nor created")


def expect(status: int, answer: dict[str, Any], what: str) -> None:
    """Raise `ClaimError` naming `what` unless MLflow answered 200."""
    if status != 200:
        raise ClaimError(f"MLflow refused {what}: HTTP {status}: {str(answer)[:500]}")


def claim_pipeline_names(spec: PipelineSpec, *, registered_model: bool = True) -> None:
    """A run's first check: its names exist and belong to the account it logs as.

    Creates the experiment and the registered model if they do not exist yet (claiming them for
    the account), on a tracking server; a local store has no owners and is left alone.

    Raises:
        NameOwnedError: another user owns one of them, or the experiment is deleted; the
            message names each, its owner as far as MLflow tells, and the fix.
        ClaimError: MLflow refused to look them up or create them.
    """
    uri = locations.tracking_uri()
    if not uri.startswith(("http://", "https://")):
        return
    claims = claim_names(mlflow_rest(uri), pipeline_names(spec, registered_model=registered_model))
    for claim in claims:
        if claim.outcome == CREATED:
            logger.info("%s", claim.describe())
    problems = [claim.problem() for claim in claims if not claim.usable]
    if problems:
        raise NameOwnedError(
            f"{spec.source}: this pipeline's runs cannot log or register in MLflow at {uri}: "
            + "; ".join(problems)
        )


def mlflow_rest(tracking_uri: str) -> Rest:
    """MLflow's REST API at `tracking_uri`, signed in as MLflow's client is (environment, or
    `~/.mlflow/credentials`)."""
    from mlflow.utils.credentials import get_default_host_creds
    from mlflow.utils.rest_utils import http_request

    creds = get_default_host_creds(tracking_uri)
    return rest_over(lambda method, path, **body: http_request(creds, path, method, **body))


def rest_over(send: Callable[..., Any]) -> Rest:
    """A `Rest` over `send(method, path, params=... | json=...)`, whose answer has `status_code`,
    `json()` and `text` (an httpx or requests response)."""

    def call(method: str, path: str, payload: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        body = {"params": payload} if method == "GET" else {"json": payload}
        response = send(method, path, **body)
        try:
            answer = response.json()
        except ValueError:
            answer = {"text": response.text[:500]}
        return response.status_code, answer if isinstance(answer, dict) else {"answer": answer}

    return call
