"""Who may do what: the principal resolved once per caller (principal), roles (roles), team
visibility (teams), what a token may reach (access), workflow and team scoping of API rows
(scoping), who sees money (costs), which ids name which team's things (subjects), the
authorisation version and the signals that move it (version, signals), and single sign-on (sso)."""
