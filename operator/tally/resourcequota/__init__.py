"""The ResourceQuota usage controller (upstream ``pkg/controller/resourcequota``)."""
