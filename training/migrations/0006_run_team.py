"""A training run belongs to a team: the FK, filled from each run's config `team` (a Team is
made for a name no workflow had)."""

import django.db.models.deletion
from django.db import migrations, models
from django.utils.text import slugify


def teams_from_configs(apps, schema_editor):
    db = schema_editor.connection.alias  # the database being migrated, not always default
    Team = apps.get_model("stack", "Team")
    TrainingRun = apps.get_model("training", "TrainingRun")
    for run in TrainingRun.objects.using(db).all().only("pk", "config"):
        name = str((run.config or {}).get("team") or "").strip()
        if not name:
            continue
        slug = (slugify(name) or "team")[:64]
        team, _ = Team.objects.using(db).get_or_create(slug=slug, defaults={"name": name[:100]})
        if run.config.get("team") != slug:
            run.config["team"] = slug  # the ledger and team budgets name teams by slug
        TrainingRun.objects.using(db).filter(pk=run.pk).update(team=team, config=run.config)


class Migration(migrations.Migration):
    dependencies = [
        ("stack", "0009_teams"),
        ("training", "0005_chunk_stopped_by"),
    ]

    operations = [
        migrations.AddField(
            model_name="trainingrun",
            name="team",
            field=models.ForeignKey(
                blank=True,
                null=True,
                on_delete=django.db.models.deletion.PROTECT,
                related_name="training_runs",
                to="stack.team",
            ),
        ),
        migrations.RunPython(teams_from_configs, migrations.RunPython.noop),
    ]
