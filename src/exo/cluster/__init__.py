"""The cluster's control plane: zenoh transport, membership and election, the ordered event log, node facts."""
