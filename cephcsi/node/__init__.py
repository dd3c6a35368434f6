"""Node layer (domain): everything NodeStage/Publish/Expand need below the CSI servicer.

Entry point `service.NodeService`; staging in `stager`, its on-disk record in `stage_record`,
mappers in `mappers/`, commands only through `exec`. The module map and the design reasoning
are in docs/design/node.md; the layering rules in docs/ARCHITECTURE.md.
"""
