"""Several troupe nodes behind one balancer: where each model goes (placement), each
node's view of its peers, and the balancer's configuration (render)."""

from troupe.cluster.nodes import NodeList
from troupe.cluster.placement import NodeFacts, Placement, node_facts, rank
from troupe.cluster.view import FORWARDED, Cluster

__all__ = ["FORWARDED", "Cluster", "NodeFacts", "NodeList", "Placement", "node_facts", "rank"]
