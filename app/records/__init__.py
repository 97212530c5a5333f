"""Records (docs/design.md#records): the interface the services use (``interface``), the filesystem
backend (``filesystem``), the tar stream of a Record (``tarstream``) and the object-store backend
(``s3``, imported only when configured: it needs boto3, the ``s3`` extra)."""

from app.records.common import SUMS
from app.records.filesystem import FilesystemRecords, write_atomic
from app.records.interface import (
    LogState,
    RecordSealed,
    RecordStore,
    RecordStoreUnavailable,
    check_location,
    check_name,
    legacy_record_location,
    location_of,
    record_location,
)

__all__ = [
    "SUMS",
    "FilesystemRecords",
    "LogState",
    "RecordSealed",
    "RecordStore",
    "RecordStoreUnavailable",
    "check_location",
    "check_name",
    "legacy_record_location",
    "location_of",
    "record_location",
    "write_atomic",
]
