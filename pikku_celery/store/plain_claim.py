"""A claim that hands its pass no view: for a store whose read costs no round trip."""

from __future__ import annotations

from ..model.plan import Claim, PassView
from ..model.values import Delivery, StepState


class PlainClaim:
    """``claim`` as ``claim_step``: the attempt's pass reads the run itself."""

    def claim_step(
        self,
        step_id: str,
        task_name: str,
        worker: str,
        lease_ms: int,
        *,
        run_id: str | None = None,
        bound_ms: int | None = None,
        delivery: Delivery | None = None,
    ) -> StepState | None:
        """The store's own claim (the port's ``claim_step``)."""
        raise NotImplementedError

    def claim(
        self,
        step_id: str,
        task_name: str,
        worker: str,
        lease_ms: int,
        *,
        run_id: str | None = None,
        bound_ms: int | None = None,
        delivery: Delivery | None = None,
        known: PassView | None = None,
    ) -> Claim | None:
        """The claimed step; no view is worth keeping here."""
        step = self.claim_step(
            step_id,
            task_name,
            worker,
            lease_ms,
            run_id=run_id,
            bound_ms=bound_ms,
            delivery=delivery,
        )
        return None if step is None else Claim(step)
