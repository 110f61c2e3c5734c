#!/usr/bin/env python3
"""Prove that ckpt and torch's DCP interoperate over S3 through AWS's ``s3torchconnector``
(``S3StorageWriter``/``S3StorageReader`` from ``s3torchconnector.dcp``, on the CRT-based
mountpoint-s3-client).

Usage (against a local moto S3 server whose bucket already exists; AWS_ACCESS_KEY_ID /
AWS_SECRET_ACCESS_KEY / AWS_REGION come from the environment; s3torchconnector==1.5.0,
s3torchconnectorclient==1.5.0 and tenacity must be importable)::

    dcp_s3torchconnector.py write s3://BUCKET/PREFIX --endpoint http://127.0.0.1:PORT --reference REF.pt
    dcp_s3torchconnector.py read  s3://BUCKET/PREFIX --endpoint http://127.0.0.1:PORT --reference REF.pt

Same state dict, same checks and same exit codes as ``dcp_fsspec.py`` (whose helpers it imports):

* ``write``: ``dcp.save`` + ``S3StorageWriter`` of the fixed state dict at the URL, and
  ``torch.save`` of the same state dict at REF.pt.
* ``read``: ``dcp.load`` + ``S3StorageReader`` of the URL into a template of REF.pt, then checks
  every leaf and the checkpoint's metadata against REF.pt. Exits 0 on success; prints each
  mismatch and exits 1 otherwise.

Endpoint: in s3torchconnector 1.5.0 the DCP classes take no ``endpoint`` argument (``S3FileSystem``
builds its ``S3Client`` from region and ``S3ClientConfig`` only), but the underlying
mountpoint-s3-client falls back to the ``AWS_ENDPOINT_URL`` environment variable when no endpoint
is given, plain ``http://`` included. So ``--endpoint`` is exported as ``AWS_ENDPOINT_URL`` before
any client is built, and path-style addressing is forced (needed for hostname endpoints such as
``localhost``; IP endpoints get it anyway).

Single process, no process group (``no_dist=True``). No network except the given endpoint.
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from dcp_fsspec import arguments, run  # noqa: E402

from s3torchconnector import S3ClientConfig  # noqa: E402
from s3torchconnector.dcp import S3StorageReader, S3StorageWriter  # noqa: E402


def main() -> int:
    args = arguments(__doc__)

    # The native client reads this when it is built (lazily, on first request).
    os.environ["AWS_ENDPOINT_URL"] = args.endpoint
    region = os.environ.get("AWS_REGION", "us-east-1")
    config = S3ClientConfig(force_path_style=True)

    return run(args.command, args.url, args.reference,
               lambda: S3StorageWriter(region, args.url, s3client_config=config),
               lambda: S3StorageReader(region, args.url, s3client_config=config))

if __name__ == "__main__":
    sys.exit(main())
