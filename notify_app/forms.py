"""The notification settings form (validated again by services.settings.notification_settings_save)."""

from django import forms

from notify_app.models import WEBHOOK_SCHEMES, NotificationSettings, webhook_url_validator


class NotificationSettingsForm(forms.ModelForm):
    """Channels and events. The webhook accepts http and https only; the service also checks that an
    enabled email has an address and the webhook's host is one the cluster allows."""

    webhook_url = forms.URLField(
        label="Webhook URL",
        required=False,
        max_length=2000,
        assume_scheme="https",
        validators=[webhook_url_validator],
        widget=forms.URLInput(
            attrs={"placeholder": "https://hooks.slack.com/services/...", "spellcheck": "false"}
        ),
        help_text=(
            f"Empty: no webhook. Gets an HTTP POST of JSON ({' or '.join(WEBHOOK_SCHEMES)} only): a Slack-"
            "compatible `text` with job_id, event, state and url; a Slack incoming-webhook URL works as is."
        ),
    )

    class Meta:
        model = NotificationSettings
        fields = ("email_enabled", "email", "webhook_url", "on_end", "on_failure", "on_qos_at_risk")

    def add_service_errors(self, exc) -> None:
        """Place a service's ValidationError next to its fields (the others above the form)."""
        for name, messages in getattr(exc, "message_dict", {"__all__": exc.messages}).items():
            for message in messages:
                self.add_error(name if name in self.fields else None, message)
