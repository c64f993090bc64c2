"""Teams own workflows and API keys: a Team table, memberships with a role per team, and the
workflow's free-text team becoming a reference to a Team (one Team per distinct old value)."""

import django.db.models.deletion
import django.utils.timezone
from django.conf import settings
from django.db import migrations, models
from django.utils.text import slugify


def teams_from_old_names(apps, schema_editor):
    db = schema_editor.connection.alias  # the database being migrated, not always default
    Team = apps.get_model("stack", "Team")
    Workflow = apps.get_model("stack", "Workflow")
    by_name = {}
    for workflow in Workflow.objects.using(db).exclude(team_name=""):
        name = workflow.team_name.strip()
        if name not in by_name:
            slug = (slugify(name) or "team")[:64]
            by_name[name], _ = Team.objects.using(db).get_or_create(slug=slug, defaults={"name": name[:100]})
        workflow.team = by_name[name]
        workflow.save(update_fields=["team"])


def team_names_back(apps, schema_editor):
    db = schema_editor.connection.alias  # the database being migrated, not always default
    Workflow = apps.get_model("stack", "Workflow")
    for workflow in Workflow.objects.using(db).exclude(team=None).select_related("team"):
        workflow.team_name = workflow.team.slug
        workflow.save(update_fields=["team_name"])


class Migration(migrations.Migration):
    dependencies = [
        ("stack", "0008_rate_limits"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.CreateModel(
            name="Team",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                ("slug", models.SlugField(max_length=64, unique=True)),
                ("name", models.CharField(max_length=100)),
                ("created_at", models.DateTimeField(default=django.utils.timezone.now, editable=False)),
                ("rpm_limit", models.PositiveIntegerField(blank=True, help_text="Requests per minute, all keys", null=True)),
                ("tpm_limit", models.PositiveIntegerField(blank=True, help_text="Tokens per minute, all keys", null=True)),
            ],
            options={"ordering": ["slug"]},
        ),
        migrations.CreateModel(
            name="TeamMembership",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                (
                    "role",
                    models.CharField(
                        choices=[("viewer", "Viewer"), ("operator", "Operator"), ("admin", "Admin"), ("auditor", "Auditor")],
                        max_length=16,
                    ),
                ),
                ("source", models.CharField(choices=[("manual", "Manual"), ("sso", "SSO")], default="manual", max_length=8)),
                ("created_at", models.DateTimeField(default=django.utils.timezone.now, editable=False)),
                (
                    "team",
                    models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name="memberships", to="stack.team"),
                ),
                (
                    "user",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="team_memberships",
                        to=settings.AUTH_USER_MODEL,
                    ),
                ),
            ],
            options={
                "ordering": ["team__slug", "user__username"],
                "constraints": [models.UniqueConstraint(fields=("team", "user"), name="one_membership_per_team_and_user")],
            },
        ),
        migrations.RenameField(model_name="workflow", old_name="team", new_name="team_name"),
        migrations.AddField(
            model_name="workflow",
            name="team",
            field=models.ForeignKey(
                blank=True, null=True, on_delete=django.db.models.deletion.PROTECT, related_name="workflows", to="stack.team"
            ),
        ),
        migrations.RunPython(teams_from_old_names, team_names_back),
        migrations.RemoveField(model_name="workflow", name="team_name"),
        migrations.AddField(
            model_name="apitoken",
            name="team",
            field=models.ForeignKey(
                blank=True, null=True, on_delete=django.db.models.deletion.PROTECT, related_name="api_tokens", to="stack.team"
            ),
        ),
    ]
