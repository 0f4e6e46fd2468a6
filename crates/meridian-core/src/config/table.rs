//! The two macros that turn a table of configuration keys into everything the configuration
//! needs of them. A row names one key once — its doc comment, its Rust type, its default and the
//! check of its range — and the macros derive from it the parser's raw field (an `Option`, so
//! "not given" and "given" stay apart, carrying the doc comment into the JSON Schema), the
//! validated field (the same doc comment), the default, the validation (the check, called with
//! the key's dotted path so its error names it) and the serialization back (`raw`, `to_raw`).
//! The invariant they keep: a key the raw struct accepts is a key the validated struct holds and
//! the way back writes, so `from_raw(c.raw()) == c` holds row by row; only the hand-written parts
//! of `config_root!` (keys whose validated form is not the raw one) can break it, and the
//! round-trip tests cover those.

/// The check of a row: the one given, else none ([`super::check::accept`]).
macro_rules! key_check {
    () => {
        $crate::config::check::accept
    };
    ($check:expr) => {
        $check
    };
}

/// One block of keys (`overload`, `predictor`, …): a raw struct that the parser reads and a
/// validated struct with the same fields.
///
/// ```text
/// config_section! {
///     /// The raw block's doc (the schema's description of its type).
///     #[schemars(rename = "Name")]
///     raw RawName at "block.";        // the dotted prefix of its keys in error messages
///     #[derive(Debug, Clone, Copy, PartialEq)]
///     pub struct Name {               // or `use struct Name`: defined elsewhere, with its own
///                                     // `Default`; its rows then carry no `= default`
///         /// The key's doc.
///         key: Type = default => check,
///     }
///     optional {                      // unset unless given: `Option<Type>` in both structs
///         /// The key's doc.
///         key: Type => check,
///     }
/// }
/// ```
macro_rules! config_section {
    (
        $(#[$raw_meta:meta])*
        raw $Raw:ident at $prefix:literal;
        $(#[$meta:meta])*
        pub struct $Name:ident {
            $( $(#[$doc:meta])* $key:ident: $ty:ty = $default:expr $(=> $check:expr)?, )*
        }
        optional {
            $( $(#[$odoc:meta])* $okey:ident: $oty:ty $(=> $ocheck:expr)?, )*
        }
    ) => {
        $(#[$meta])*
        pub struct $Name {
            $(
                $(#[$doc])*
                #[doc = ""]
                #[doc = concat!("Default: `", stringify!($default), "`.")]
                pub $key: $ty,
            )*
            $( $(#[$odoc])* pub $okey: Option<$oty>, )*
        }

        impl Default for $Name {
            fn default() -> Self {
                Self { $( $key: $default, )* $( $okey: None, )* }
            }
        }

        config_section!(@parse $(#[$raw_meta])* $Raw $prefix $Name
            { $( $(#[$doc])* $key: $ty => [$($check)?], )* }
            { $( $(#[$odoc])* $okey: $oty => [$($ocheck)?], )* });
    };
    (
        $(#[$raw_meta:meta])*
        raw $Raw:ident at $prefix:literal;
        use struct $Name:ident {
            $( $(#[$doc:meta])* $key:ident: $ty:ty $(=> $check:expr)?, )*
        }
        optional {
            $( $(#[$odoc:meta])* $okey:ident: $oty:ty $(=> $ocheck:expr)?, )*
        }
    ) => {
        config_section!(@parse $(#[$raw_meta])* $Raw $prefix $Name
            { $( $(#[$doc])* $key: $ty => [$($check)?], )* }
            { $( $(#[$odoc])* $okey: $oty => [$($ocheck)?], )* });
    };
    (@parse $(#[$raw_meta:meta])* $Raw:ident $prefix:literal $Name:ident
        { $( $(#[$doc:meta])* $key:ident: $ty:ty => [$($check:expr)?], )* }
        { $( $(#[$odoc:meta])* $okey:ident: $oty:ty => [$($ocheck:expr)?], )* }
    ) => {
        #[derive(Debug, Clone, Default, Deserialize, Serialize, JsonSchema)]
        $(#[$raw_meta])*
        #[serde(deny_unknown_fields)]
        struct $Raw {
            $( $(#[$doc])* #[serde(skip_serializing_if = "Option::is_none")] $key: Option<$ty>, )*
            $( $(#[$odoc])* #[serde(skip_serializing_if = "Option::is_none")] $okey: Option<$oty>, )*
        }

        impl $Name {
            /// The block validated; an absent key takes its default.
            fn from_raw(raw: $Raw) -> Result<Self> {
                let defaults = <$Name as Default>::default();
                Ok(Self {
                    $( $key: (key_check!($($check)?))(
                        concat!($prefix, stringify!($key)),
                        match raw.$key { Some(given) => given, None => defaults.$key },
                    )?, )*
                    $( $okey: match raw.$okey {
                        Some(given) => Some((key_check!($($ocheck)?))(concat!($prefix, stringify!($okey)), given)?),
                        None => None,
                    }, )*
                })
            }

            /// The block as the raw one that validates back to it: every key given but the
            /// optional ones left unset.
            fn raw(&self) -> $Raw {
                $Raw {
                    $( $key: Some(Clone::clone(&self.$key)), )*
                    $( $okey: Clone::clone(&self.$okey), )*
                }
            }
        }
    };
}

/// The top level: rows as in [`config_section!`], then blocks (`key: RawType => Type`, each
/// validated by its own `from_raw`), then the keys whose validated form is not their raw one
/// (`hand_raw`: the raw fields; `hand`: the validated fields), whose conversions are the two
/// expressions `from_hand` (the validated fields as a tuple, in `hand` order; it may read every
/// row and block already validated, by its key's name, and every `hand_raw` key as given) and
/// `to_hand(config)` (the `hand_raw` fields as a tuple, in order).
macro_rules! config_root {
    (
        $(#[$raw_meta:meta])*
        raw $Raw:ident;
        $(#[$meta:meta])*
        pub struct $Name:ident {
            $( $(#[$doc:meta])* $key:ident: $ty:ty = $default:expr $(=> $check:expr)?, )*
        }
        optional {
            $( $(#[$odoc:meta])* $okey:ident: $oty:ty $(=> $ocheck:expr)?, )*
        }
        blocks {
            $( $(#[$sdoc:meta])* $skey:ident: $SRaw:ident => $sty:ty, )*
        }
        hand_raw {
            $( $(#[$hdoc:meta])* $hkey:ident: $hty:ty, )*
        }
        hand {
            $( $(#[$cdoc:meta])* $ckey:ident: $cty:ty, )*
        }
        from_hand $from_hand:block
        to_hand($config:ident) $to_hand:block
    ) => {
        #[derive(Debug, Clone, Default, Deserialize, Serialize, JsonSchema)]
        $(#[$raw_meta])*
        #[serde(deny_unknown_fields)]
        struct $Raw {
            $( $(#[$doc])* #[serde(skip_serializing_if = "Option::is_none")] $key: Option<$ty>, )*
            $( $(#[$odoc])* #[serde(skip_serializing_if = "Option::is_none")] $okey: Option<$oty>, )*
            $( $(#[$sdoc])* #[serde(skip_serializing_if = "Option::is_none")] $skey: Option<$SRaw>, )*
            $( $(#[$hdoc])* #[serde(skip_serializing_if = "Option::is_none")] $hkey: Option<$hty>, )*
        }

        $(#[$meta])*
        pub struct $Name {
            $(
                $(#[$doc])*
                #[doc = ""]
                #[doc = concat!("Default: `", stringify!($default), "`.")]
                pub $key: $ty,
            )*
            $( $(#[$odoc])* pub $okey: Option<$oty>, )*
            $( $(#[$sdoc])* pub $skey: $sty, )*
            $( $(#[$cdoc])* pub $ckey: $cty, )*
        }

        impl $Name {
            fn from_raw(raw: $Raw) -> Result<Self> {
                let $Raw { $( $key, )* $( $okey, )* $( $skey, )* $( $hkey, )* } = raw;
                $( let $key = (key_check!($($check)?))(
                    stringify!($key),
                    match $key { Some(given) => given, None => $default },
                )?; )*
                $( let $okey = match $okey {
                    Some(given) => Some((key_check!($($ocheck)?))(stringify!($okey), given)?),
                    None => None,
                }; )*
                $( let $skey = <$sty>::from_raw($skey.unwrap_or_default())?; )*
                let ($( $ckey, )*) = $from_hand;
                Ok(Self { $( $key, )* $( $okey, )* $( $skey, )* $( $ckey, )* })
            }

            fn to_raw(&self) -> $Raw {
                let $config = self;
                let ($( $hkey, )*) = $to_hand;
                $Raw {
                    $( $key: Some(Clone::clone(&self.$key)), )*
                    $( $okey: Clone::clone(&self.$okey), )*
                    $( $skey: Some(self.$skey.raw()), )*
                    $( $hkey, )*
                }
            }
        }
    };
}
