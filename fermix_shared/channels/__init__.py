"""Channel adapters: inbound events normalized by the gateway, outbound replies sent by workers."""
