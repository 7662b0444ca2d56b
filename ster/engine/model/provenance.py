"""What a fitted direction or a trained adapter records of the model it was made on, checked against the run.

The model it was made for must be the one loaded (by checkpoint fingerprint where one is recorded, by
name otherwise), or the job is refused; the precision and chat template it was made at may differ, and
each difference is a warning that says what it means.
"""

from __future__ import annotations

from ster.engine.model.fingerprint import SCHEME, short
from ster.engine.protocol.errors import Refusal


def check_identity(
    noun: str,
    recorded_model: str,
    recorded: str | None,
    model: str,
    fingerprint: str,
    since: str,
    *,
    both_prints: bool = True,
) -> str | None:
    """Refuse an artifact or adapter (``noun``) made for another checkpoint than the one loaded; None when it
    is the same, or a note when only the name it was made with differs but the fingerprint matches.

    A record without a fingerprint of this scheme is matched by the model's name alone. ``since`` ends the
    sentence for a checkpoint whose weights changed under the same name ("the direction was fitted"). With
    ``both_prints`` false, a refusal for another model keeps to the names (the adapter contract's sentence)."""
    same_name = recorded_model == model
    other = f'{noun} was trained for model "{recorded_model}", current model is "{model}"'
    if recorded is None or not recorded.startswith(f"{SCHEME}:"):
        if not same_name:
            raise Refusal(other)
        return None
    if recorded == fingerprint:
        return (
            None
            if same_name
            else (
                f'{noun} was trained for model "{recorded_model}"; "{model}" has the same '
                f"checkpoint fingerprint ({short(fingerprint)}), so it is the same model"
            )
        )
    if same_name:
        raise Refusal(
            f'{noun} was trained for model "{model}" with checkpoint fingerprint {short(recorded)}, but '
            f'the checkpoint now at "{model}" has fingerprint {short(fingerprint)}: its weights or '
            f"architecture changed since {since}"
        )
    if not both_prints:
        raise Refusal(other)
    raise Refusal(f"{other}, and their checkpoint fingerprints differ too ({short(recorded)} and {short(fingerprint)})")


def provenance_warnings(
    noun: str,
    fitted_precision: str | None,
    fitted_chat: str | None,
    precision: str,
    chat_template: str | None,
    consequence: str,
) -> list[str]:
    """The warnings for a ``noun`` (direction, adapter) made at ``fitted_*`` and read at the run's settings; none
    for null records. ``consequence`` ends the chat-template sentence with what the mismatch means there."""
    warnings = []
    if fitted_chat is not None and chat_template is not None and fitted_chat != chat_template:
        warnings.append(
            f"this {noun} was trained with chat template {fitted_chat} and this run encodes "
            f"{chat_template}, {consequence}"
        )
    if fitted_precision is not None and fitted_precision != precision:
        warnings.append(
            f"this {noun} was trained at precision {fitted_precision} and this run maps the base "
            f"weights at {precision}, so it is being read in a different space than it was fitted in"
        )
    return warnings
