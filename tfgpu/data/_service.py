"""The trainer's part of `pipeline(..., service=...)` (docs/data_service.md): the dispatcher
checked, in-memory arrays in chunks, the `distribute` step (servers: `_internal/adapters`)."""

from __future__ import annotations

import itertools
import os
import socket
import uuid
from typing import Any

import tensorflow as tf

from tfgpu._internal.adapters.data_service import Address, consumers, job_name
from tfgpu._internal.helpers.checks import invalid_value
from tfgpu._internal.helpers.cluster import resolve_cluster

# A wrong address fails in seconds, naming it, instead of a hang; then the longest wait for the
# dispatcher's answer to one small RPC (a port that accepts it may be no dispatcher's).
_CONNECT_TIMEOUT_S, _ANSWER_TIMEOUT_S = 3.0, 5.0
# The dispatcher's cheapest RPC (tensorflow/core/data/service/dispatcher.proto); its request is
# an empty message, serialized as no bytes.
_GET_VERSION = "/tensorflow.data.DispatcherService/GetVersion"
# In-memory examples per split (one split is one RPC to the dispatcher): big enough that the
# RPCs cost nothing next to the work, small enough that several workers share a small dataset.
_MAX_CHUNK = 256
_MIN_SPLITS = 32

_serial = itertools.count()
_TOKEN = uuid.uuid4().hex[:12]


def check_dispatcher(address: Address) -> None:
    """Raises `ConnectionError` unless a dispatcher at `address` answers `GetVersion` in time."""
    try:
        with socket.create_connection((address.connect_host, address.port), _CONNECT_TIMEOUT_S):
            pass
    except OSError as e:
        raise ConnectionError(
            f"tfgpu.data.pipeline: the tf.data service dispatcher at {address.target} is not "
            f"reachable ({type(e).__name__}: {e.strerror or e}, after at most "
            f"{_CONNECT_TIMEOUT_S:g} s). Start one there (`tfgpu data-service dispatcher --port "
            f"{address.port}` on {address.host}) or pass the right `service` address."
        ) from e
    import grpc  # a dependency of TensorFlow

    channel = grpc.insecure_channel(f"{address.host}:{address.port}")
    try:
        channel.unary_unary(_GET_VERSION)(b"", timeout=_ANSWER_TIMEOUT_S)
        return
    except grpc.RpcError as e:  # every RPC failure; a call object with code() and details()
        code = e.code() if isinstance(e, grpc.Call) else None
        details = e.details() if isinstance(e, grpc.Call) else str(e)
    finally:
        channel.close()
    if code is grpc.StatusCode.UNIMPLEMENTED:
        answered = (
            "a gRPC server that is not a dispatcher (a tf.data service worker's port?) "
            f"answered: {details}"
        )
    elif code is grpc.StatusCode.DEADLINE_EXCEEDED:
        answered = f"the port accepts connections but nothing answered in {_ANSWER_TIMEOUT_S:g} s"
    else:
        name = code.name if code is not None else "no status"
        answered = f"no dispatcher answered the call ({name}: {details})"
    refused = invalid_value(
        "service",
        address.target,
        f"the address of a tf.data service dispatcher (`tfgpu data-service dispatcher "
        f"--port {address.port}` on {address.host}), not a worker's",
        received=f"service={address.target!r}, where {answered}",
    )
    # What answered is learnt by connecting: a ConnectionError, as for no answer at all.
    raise ConnectionError(str(refused))


def chunk_size(num_examples: int) -> int:
    """In-memory examples per dispatcher split."""
    return max(1, min(_MAX_CHUNK, num_examples // _MIN_SPLITS))


def memory_source(value: Any, num_examples: int) -> tf.data.Dataset:
    """The first `num_examples` examples of in-memory data, one split per chunk index (the
    worker slices the chunk): `from_tensor_slices` makes each example a split (1,000/s)."""
    tensors = tf.nest.map_structure(
        lambda a: a if isinstance(a, (tf.Tensor, tf.RaggedTensor)) else tf.convert_to_tensor(a),
        value,
    )
    chunk = chunk_size(num_examples)
    count = -(-num_examples // chunk)

    def slice_chunk(i: tf.Tensor) -> Any:
        start = i * chunk
        stop = tf.minimum(start + chunk, num_examples)
        return tf.nest.map_structure(lambda t: t[start:stop], tensors)

    # No `assert_cardinality`: each worker sees only its share. The plan gets the count.
    return tf.data.Dataset.range(count).map(slice_chunk).unbatch()


def distributed(
    ds: tf.data.Dataset, address: Address, explicit_name: str | None, *, repeat: bool
) -> tf.data.Dataset:
    """`ds` run by the service's workers (dynamic sharding) as one job, read by this process."""
    cluster = resolve_cluster(os.environ, strict=False)
    name = job_name(
        explicit_name, cluster=cluster, environ=os.environ, serial=next(_serial), token=_TOKEN
    )
    index, count = consumers(cluster, repeat=repeat)
    service = tf.data.experimental.service
    return ds.apply(
        service.distribute(
            processing_mode=service.ShardingPolicy.DYNAMIC,
            service=address.target,
            job_name=name,
            consumer_index=index,
            num_consumers=count,
        )
    )
