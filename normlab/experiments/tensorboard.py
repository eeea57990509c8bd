"""A minimal TensorBoard event-file writer (scalars only), so ``tensorboard --logdir SWEEP_DIR/tb`` shows a sweep
without making ``tensorboard`` (~60 MB installed with grpcio, protobuf and its data server) a dependency.

File format (TensorFlow ``TFRecord`` of ``Event`` protos, as written by ``torch.utils.tensorboard``): each record is
``uint64 length | uint32 masked_crc32c(length) | data | uint32 masked_crc32c(data)``, little-endian; the first event
carries ``file_version = "brain.Event:2"``; each scalar is ``Event{wall_time=1 (double), step=2 (int64),
summary=5 {value=1 {tag=1 (string), simple_value=2 (float)}}}``. ``read_scalars`` decodes what ``write_scalars``
writes (tests also check the files with TensorBoard's own reader when it is installed).
"""

from __future__ import annotations

import math
import os
import socket
import struct
import time
import tempfile
from pathlib import Path

_CRC_TABLE: list[int] = []


def _crc32c(data: bytes) -> int:
    """CRC-32C (Castagnoli, reflected polynomial 0x82F63B78)."""
    if not _CRC_TABLE:
        for i in range(256):
            c = i
            for _ in range(8):
                c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
            _CRC_TABLE.append(c)
    crc = 0xFFFFFFFF
    for b in data:
        crc = _CRC_TABLE[(crc ^ b) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def _masked_crc(data: bytes) -> int:
    crc = _crc32c(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def _varint(n: int) -> bytes:
    if n < 0:
        n += 1 << 64
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _bytes_field(num: int, payload: bytes) -> bytes:
    return _varint((num << 3) | 2) + _varint(len(payload)) + payload


def _event(wall_time: float, step: int, *, file_version: str | None = None, tag: str | None = None,
           value: float | None = None) -> bytes:
    msg = b"\x09" + struct.pack("<d", wall_time) + b"\x10" + _varint(int(step))
    if file_version is not None:
        msg += _bytes_field(3, file_version.encode())
    if tag is not None:
        val = _bytes_field(1, tag.encode()) + b"\x15" + struct.pack("<f", float(value))
        msg += _bytes_field(5, _bytes_field(1, val))
    return msg


def _record(data: bytes) -> bytes:
    header = struct.pack("<Q", len(data))
    return header + struct.pack("<I", _masked_crc(header)) + data + struct.pack("<I", _masked_crc(data))


def write_scalars(log_dir: str | Path, scalars: list[tuple[str, int, float]], wall_time: float | None = None) -> Path:
    """Replace the event files in ``log_dir`` by one holding ``scalars`` (``(tag, step, value)``); atomic.

    Non-finite values are skipped (TensorBoard shows them as gaps anyway). Returns the event file path.
    """
    log_dir = Path(log_dir)
    log_dir.mkdir(parents=True, exist_ok=True)
    t0 = time.time() if wall_time is None else wall_time
    name = f"events.out.tfevents.{int(t0)}.{socket.gethostname()}.{os.getpid()}.normlab"
    blob = bytearray(_record(_event(t0, 0, file_version="brain.Event:2")))
    for tag, step, value in scalars:
        v = float(value)
        if not math.isfinite(v):
            continue
        blob += _record(_event(t0, step, tag=tag, value=v))
    path = log_dir / name
    fd, tmp = tempfile.mkstemp(prefix=f".{name}.", suffix=".tmp", dir=log_dir)  # atomic: whole file or none
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(bytes(blob))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    for old in log_dir.glob("events.out.tfevents.*"):
        if old != path:
            old.unlink(missing_ok=True)
    return path


def _read_varint(buf: bytes, i: int) -> tuple[int, int]:
    shift = n = 0
    while True:
        b = buf[i]
        i += 1
        n |= (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            return n, i


def _fields(buf: bytes):
    i = 0
    while i < len(buf):
        key, i = _read_varint(buf, i)
        num, wire = key >> 3, key & 7
        if wire == 0:
            v, i = _read_varint(buf, i)
        elif wire == 1:
            v, i = buf[i : i + 8], i + 8
        elif wire == 5:
            v, i = buf[i : i + 4], i + 4
        elif wire == 2:
            ln, i = _read_varint(buf, i)
            v, i = buf[i : i + ln], i + ln
        else:
            raise ValueError(f"unsupported wire type {wire}")
        yield num, wire, v


def read_scalars(path: str | Path) -> list[tuple[str, int, float]]:
    """Decode the scalar events of one event file (checks every CRC); returns ``(tag, step, value)`` rows."""
    data = Path(path).read_bytes()
    out, i = [], 0
    while i < len(data):
        header = data[i : i + 8]
        (length,) = struct.unpack("<Q", header)
        if struct.unpack("<I", data[i + 8 : i + 12])[0] != _masked_crc(header):
            raise ValueError(f"{path}: bad length CRC at offset {i}")
        payload = data[i + 12 : i + 12 + length]
        if struct.unpack("<I", data[i + 12 + length : i + 16 + length])[0] != _masked_crc(payload):
            raise ValueError(f"{path}: bad data CRC at offset {i}")
        i += 16 + length
        step = 0
        for num, _, v in _fields(payload):
            if num == 2:
                step = v
            elif num == 5:
                for _, _, value_msg in _fields(v):
                    tag, val = None, None
                    for n2, _, v2 in _fields(value_msg):
                        if n2 == 1:
                            tag = v2.decode()
                        elif n2 == 2:
                            val = struct.unpack("<f", v2)[0]
                    if tag is not None and val is not None:
                        out.append((tag, step, val))
    return out
