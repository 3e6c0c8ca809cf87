"""Topic mode (docs/topics.md): shared rules, the round's dispatcher, the push job."""
