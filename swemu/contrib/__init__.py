"""Optional integrations that pull in third-party packages the core never imports."""
