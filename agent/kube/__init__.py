"""The agent's ways to the API server: the client (``client``), watches that survive errors
(``watching``), and the node's own reads and writes (its Instances' label, its pods and claims as
the kubelet, its account, its liveness Lease, its right to offer a Configuration).
"""
