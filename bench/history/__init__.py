"""The gate's memory: every gate's decision.json kept per machine and commit (store), read
back in commit order as one series per gated metric and configuration (series), the step
and creep rules over it (rules), and the page `bench history` draws (figures, page).
docs/history.md says how to keep the directory between CI runs and states the rules."""
