"""From outliers to findings: fusion into culprits and causes, expected ranges, the other
finding kinds (collectives, imbalance, kernel speed, nodes, throttling), and their wording."""
