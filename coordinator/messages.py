"""What the coordinator's state machine returns that never leaves the coordinator as such.

Every message that crosses the wire is a plain type of ``proto/messages.py``,
shared with the node. :class:`ResultView` is the one view of the session that
names a file of the coordinator's own (the stored aggregate): the servicer
(coordinator/server.py) sends its header (``proto.convert.result_header_to_pb``)
and streams the file.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from noise.layout import Layout
from proto.chunks import payload_spec
from proto.messages import (
    PayloadSpec,
    ResultHeader,
    RoundState,
    Sealed,
    UnmaskRequest,
    UploadStatement,
)

__all__ = ["ResultView"]


@dataclass(frozen=True)
class ResultView:
    """A round's status; when READY, also the aggregate's header and stored file.

    ``status``: a stored round status (``proto.messages.RoundState``).
    ``survivors``: READY, the nodes summed; AWAITING_UNMASK, the current S;
    OPEN, the round's participants (the nodes expected to upload). ``dropped``:
    the participants left out (READY) or the current D (AWAITING_UNMASK).
    ``statements``: READY only, the upload statement of every survivor.
    """

    session_id: str
    round_index: int
    round_name: str
    status: str
    reason: str
    deadline_ms: int
    survivors: tuple[str, ...]
    dropped: tuple[str, ...]
    survivor_hash: bytes
    payload: PayloadSpec | None
    path: Path | None
    unmask_request: UnmaskRequest | None
    statements: tuple[UploadStatement, ...] = ()
    tags: tuple[Sealed, ...] = ()  # READY: every other survivor's tags sealed for the caller

    def header(self) -> ResultHeader:
        """The first message of a result stream: the round's status and, when ready, its payload.

        The stored aggregate file never leaves the coordinator; the payload's
        header is made again from its layout and digest.
        """
        spec = self.payload
        return ResultHeader(
            session_id=self.session_id,
            round_index=self.round_index,
            round_name=self.round_name,
            state=RoundState(self.status),
            reason=self.reason,
            deadline_ms=self.deadline_ms,
            survivors=self.survivors,
            dropped=self.dropped,
            survivor_hash=self.survivor_hash,
            payload=(
                None
                if spec is None
                else payload_spec(
                    None, Layout(spec.tensors), spec.fixed_point_bits, digest=spec.digest
                )
            ),
            unmask_request=self.unmask_request,
            statements=self.statements,
            tags=self.tags,
        )
