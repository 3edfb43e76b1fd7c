"""`embedfleet-operator`: runs the kopf operator (in-cluster config, or $KUBECONFIG outside)."""

from __future__ import annotations

import logging
from collections.abc import Sequence

import kopf

from embedfleet.common import logs
from embedfleet.common.settings import load
from embedfleet.operator import handlers  # noqa: F401  (registers the kopf handlers)
from embedfleet.operator.settings import ENV_PREFIX, OperatorSettings


def main(argv: Sequence[str] | None = None) -> int:
    settings = load(
        OperatorSettings,
        ENV_PREFIX,
        argv,
        prog="embedfleet-operator",
        description="Reconciles EmbeddingDeployments into serving fleets.",
    )
    json_lines = logs.is_json(settings.log_format)
    kopf.configure(
        verbose=settings.log_level == "debug",
        log_format=kopf.LogFormat.JSON if json_lines else kopf.LogFormat.FULL,
    )
    logging.getLogger().setLevel(settings.log_level.upper())
    if settings.log_level != "debug":
        # kopf logs every handler call at INFO: one line per watch event of every child.
        logging.getLogger("kopf.objects").setLevel(logging.WARNING)
    memo = kopf.Memo(settings=settings, lost_leadership=False)
    kopf.run(
        clusterwide=not settings.namespace,
        namespaces=[settings.namespace] if settings.namespace else (),
        standalone=True,
        memo=memo,
    )
    return 1 if memo.get("lost_leadership") else 0
