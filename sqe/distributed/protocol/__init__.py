"""The ``sqe.worker.v1`` wire protocol shared by the coordinator and the scan workers.

``_proto`` holds the code generated from ``proto/sqe/worker/v1/worker.proto`` (never committed), ``ticket`` the
scan-ticket codec (``CredentialSet`` <-> protobuf included), ``credential_sets`` the one check of the credential
sets a ticket or a push carries, ``ipc`` the Arrow IPC framing of ``Execute`` streams and ``errors`` the error kinds
a worker reports in trailing metadata.
"""
