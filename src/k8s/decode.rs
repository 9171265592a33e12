//! Decoding only what is kept. A watch event or a write's answer carries the whole object,
//! managedFields and every annotation included; what the controllers keep of it is far less, and
//! what is skipped while the JSON is read is never allocated (`make bench`'s `decode_cost`).

use serde::Deserializer;
use serde::de::{IgnoredAny, MapAccess, Visitor};
use std::{borrow::Cow, collections::BTreeMap, fmt};

/// A map of strings (labels, annotations) with only the entries whose key `keep` accepts; the
/// others' values are skipped unread. `null` or absent: `None`, as k8s-openapi decodes it.
pub fn map_keeping<'de, D: Deserializer<'de>>(
    d: D,
    keep: fn(&str) -> bool,
) -> Result<Option<BTreeMap<String, String>>, D::Error> {
    struct Keeping(fn(&str) -> bool);
    impl<'de> Visitor<'de> for Keeping {
        type Value = Option<BTreeMap<String, String>>;
        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            f.write_str("a map of strings")
        }
        fn visit_unit<E>(self) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_none<E>(self) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
            d.deserialize_map(self)
        }
        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
            let mut kept = BTreeMap::new();
            while let Some(Key(key)) = map.next_key::<Key<'de>>()? {
                if (self.0)(&key) {
                    kept.insert(key.into_owned(), map.next_value::<String>()?);
                } else {
                    map.next_value::<IgnoredAny>()?;
                }
            }
            Ok(Some(kept))
        }
    }
    d.deserialize_option(Keeping(keep))
}

/// A key as read: borrowed from the input where it can be (serde's own `Cow<str>` always copies).
struct Key<'de>(Cow<'de, str>);

impl<'de> serde::Deserialize<'de> for Key<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Text;
        impl<'de> Visitor<'de> for Text {
            type Value = Key<'de>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a string")
            }
            fn visit_borrowed_str<E>(self, s: &'de str) -> Result<Key<'de>, E> {
                Ok(Key(Cow::Borrowed(s)))
            }
            fn visit_str<E>(self, s: &str) -> Result<Key<'de>, E> {
                Ok(Key(Cow::Owned(s.to_string())))
            }
        }
        d.deserialize_str(Text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;

    #[derive(Deserialize)]
    struct Meta {
        #[serde(default, deserialize_with = "only_a")]
        annotations: Option<BTreeMap<String, String>>,
    }

    fn only_a<'de, D: Deserializer<'de>>(
        d: D,
    ) -> Result<Option<BTreeMap<String, String>>, D::Error> {
        map_keeping(d, |k| k.starts_with("a/"))
    }

    fn annotations(json: &str) -> Option<BTreeMap<String, String>> {
        serde_json::from_str::<Meta>(json).unwrap().annotations
    }

    #[test]
    fn a_map_keeps_only_the_keys_asked_for_and_null_or_absent_is_none() {
        let kept =
            annotations(r#"{"annotations": {"b/x": "{\"big\": 1}", "a/y": "1", "a\/z": "2"}}"#);
        assert_eq!(
            kept.unwrap().into_iter().collect::<Vec<_>>(),
            [
                ("a/y".to_string(), "1".to_string()),
                ("a/z".into(), "2".into())
            ]
        );
        assert_eq!(annotations(r#"{"annotations": {}}"#), Some(BTreeMap::new()));
        assert_eq!(annotations(r#"{"annotations": null}"#), None);
        assert_eq!(annotations("{}"), None);
        assert!(serde_json::from_str::<Meta>(r#"{"annotations": {"a/y": 1}}"#).is_err());
    }
}
