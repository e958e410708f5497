"""Fuzz the worker's ticket decoder: arbitrary protobuf ScanTickets give a decoded ticket or InvalidTicketError."""

from __future__ import annotations

from google.protobuf.message import DecodeError
from hypothesis import given
from hypothesis import strategies as st

from sqe.distributed.protocol._proto import worker_pb2 as pb
from sqe.distributed.protocol.errors import InvalidTicketError
from sqe.distributed.protocol.ticket import decode_ticket
from tests.fuzz.checks import assert_one_line


@given(st.binary(max_size=400))
def test_arbitrary_ticket_bytes_decode_or_fail_typed(data: bytes) -> None:
    try:
        message = pb.ScanTicket.FromString(data)
    except DecodeError:
        return  # the gRPC layer refuses these before the decoder sees them
    try:
        decode_ticket(message)
    except InvalidTicketError as exc:
        assert_one_line(str(exc))
