"""mmrl: RL from verifiable rewards for multimodal LMs."""
__version__ = "0.1.0"
