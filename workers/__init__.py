"""SQE scan workers (gRPC)."""
